# frozen_string_literal: true

require "stringio"
require "socket"

RSpec.describe Pgbus::Hub::Protocol do
  def bytes(hex) = [hex].pack("H*")

  it "exposes pgbus's constants and error classes" do
    expect(described_class::MAX_FRAME_BYTES).to eq(4 * 1024 * 1024)
    expect(VECTORS["max_frame_bytes"]).to eq(described_class::MAX_FRAME_BYTES)
    expect(Pgbus::Hub::ProtocolError.ancestors).to include(StandardError)
    expect(described_class::ProtocolError).to equal(Pgbus::Hub::ProtocolError)
  end

  it "has all 25 shared vector cases" do
    expect(VECTORS["cases"].size).to eq(25)
  end

  VECTORS["cases"].each do |c|
    case c["kind"]
    when "valid"
      it "#{c['name']}: encodes byte-exactly and reads back" do
        frame = described_class.encode(c["message"])
        expect(frame.encoding).to eq(Encoding::BINARY)
        expect(frame.unpack1("H*")).to eq(c["bytes_hex"])
        expect(described_class.read_frame(StringIO.new(frame))).to eq(c["message"])
      end
    when "read"
      it "#{c['name']}: read_frame gives #{c['reference_outcome']}" do
        io = StringIO.new(bytes(c["bytes_hex"]))
        if c["reference_outcome"] == "eof"
          expect(described_class.read_frame(io)).to be_nil
        else
          expect { described_class.read_frame(io) }.to raise_error(Pgbus::Hub::ProtocolError)
        end
      end
    when "encode"
      it "#{c['name']}: refuses to encode an over-cap body" do
        message = { "t" => "wake", "q" => "big", "p" => "x" * (4 * 1024 * 1024) }
        expect { described_class.encode(message) }
          .to raise_error(Pgbus::Hub::ProtocolError, /\Aframe too large: \d+ bytes \(max 4194304\)\z/)
      end
    when "stream"
      it "#{c['name']}: reads frames back to back, then EOF" do
        io = StringIO.new(bytes(c["bytes_hex"]))
        frames = Array.new(c["messages"].size) { described_class.read_frame(io) }
        expect(frames).to eq(c["messages"])
        expect(described_class.read_frame(io)).to be_nil
      end
    else
      raise "unknown vector kind #{c['kind']}"
    end
  end

  it "uses the reference wording for errors" do
    expect { described_class.read_frame(StringIO.new(bytes("ffffffff"))) }
      .to raise_error(Pgbus::Hub::ProtocolError, "frame too large: 4294967295 bytes (max 4194304)")
    expect { described_class.read_frame(StringIO.new(bytes("000000075b312c322c335d"))) }
      .to raise_error(Pgbus::Hub::ProtocolError, "malformed frame: expected a JSON object, got Array")
    expect { described_class.read_frame(StringIO.new(bytes("0000000b7b2274223a2261636b222c"))) }
      .to raise_error(Pgbus::Hub::ProtocolError, /\Amalformed frame: /)
  end

  it "encodes Symbol keys and values like JSON.generate, and matches it for plain data" do
    message = { t: :sub, q: "chat", "n" => [1, 2.5, nil, true, false, { "x" => -3 }] }
    expected = JSON.generate(message)
    expect(described_class.encode(message)).to eq([expected.bytesize].pack("N") + expected.b)
  end

  it "raises clear errors for values a frame cannot carry" do
    expect { described_class.encode({ "x" => Object.new }) }.to raise_error(TypeError, /Object/)
    expect { described_class.encode({ "x" => "\xff".b }) }.to raise_error(Pgbus::Hub::ProtocolError, /utf-8/)
    expect { described_class.encode({ "x" => Float::NAN }) }.to raise_error(Pgbus::Hub::ProtocolError, /NaN/)
    expect { described_class.encode({ "x" => 2**70 }) }.to raise_error(RangeError)
    expect { described_class.encode("not a hash") }.to raise_error(TypeError)
  end

  context "over a real UNIXSocket pair" do
    it "reads frames as they arrive, then nil when the writer closes mid-frame" do
      reader, writer = UNIXSocket.pair
      sub = described_class.encode({ "t" => "sub", "q" => "chat" })
      writer.write(sub)
      writer.write(sub[0, 6]) # header + two body bytes, then the writer dies
      writer.close
      expect(described_class.read_frame(reader)).to eq({ "t" => "sub", "q" => "chat" })
      expect(described_class.read_frame(reader)).to be_nil
    ensure
      reader&.close
    end

    it "waits for a frame split across writes" do
      reader, writer = UNIXSocket.pair
      frame = described_class.encode({ "t" => "wake", "q" => "q", "p" => "héllo" })
      thread = Thread.new { described_class.read_frame(reader) }
      frame.each_char.each_slice(3) { |part| writer.write(part.join); sleep 0.001 }
      expect(thread.value).to eq({ "t" => "wake", "q" => "q", "p" => "héllo" })
    ensure
      [reader, writer].each { |s| s&.close }
    end

    it "treats a pipe's EOF and a reset peer as nil" do
      r, w = IO.pipe
      w.close
      expect(described_class.read_frame(r)).to be_nil
      r.close

      a, b = Socket.pair(:UNIX, :STREAM)
      a.write("x") # unread data + close => the peer sees ECONNRESET or EOF
      b.write(described_class.encode({ "t" => "ack", "q" => "z" })[0, 2])
      b.setsockopt(Socket::SOL_SOCKET, Socket::SO_LINGER, [1, 0].pack("ii"))
      b.close
      expect(described_class.read_frame(a)).to be_nil
      a.close
    end
  end
end
