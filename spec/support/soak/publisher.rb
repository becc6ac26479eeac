# frozen_string_literal: true

require "json"
require "pg"

module Soak
  # Sequence-numbered messages at +rate+ per second to both paths of every app,
  # straight to the cluster (not through the apps' proxies): each is {seq, t}
  # on the app's ActionCable room and "SEQ T" on its stream channel, in one
  # statement; recorded in `pubs` as {adapter => {seq => [t, committed_at]}}
  # only once it committed. `rake soak` and `rake stops` account from these.
  class Publisher
    attr_reader :pubs, :errors

    def initialize(pg, apps, rate:, log:)
      @pg = pg
      @apps = apps
      @tick = 1.0 / rate
      @log = log
      @pubs = Hash.new { |h, k| h[k] = {} }
      @errors = Hash.new(0)
      @backends = {}
      @stop = false
    end

    def start(deadline)
      @thread = Thread.new { run(deadline) }
      self
    end

    def stop
      @stop = true
      @thread&.join(10) || @thread&.kill
    end

    # The publishing connections' backend pids ("{1,2}"), spared by a fault that terminates the rest.
    def backend_pids = "{#{@backends.values.compact.join(',')}}"

    private

    def run(deadline)
      conns = {}
      seq = 0
      next_at = Soak.now
      until @stop || Soak.now > deadline
        seq += 1
        @apps.each { |app| publish(conns, app, seq) }
        next_at += @tick
        pause = next_at - Soak.now
        pause.positive? ? sleep(pause) : next_at = Soak.now
      end
    ensure
      conns&.each_value { |c| c.close rescue nil } # rubocop:disable Style/RescueModifier
    end

    def publish(conns, app, seq)
      t = Soak.now
      conn = conns[app.adapter] ||= PG.connect(@pg.url(dbname: app.db).sub("user=root", "user=root connect_timeout=2"))
                                      .tap { |c| @backends[app.adapter] = c.backend_pid }
      payload = JSON.generate(seq: seq, t: t)
      if app.hub?
        conn.exec_params("select pg_notify($1, $2), pg_notify($3, $4)",
                         [app.cable_room, payload, app.stream_channel, "#{seq} #{t}"])
      else
        conn.exec_params("select pg_notify($1, $2)", [app.cable_room, payload])
      end
      @pubs[app.adapter][seq] = [t, Soak.now]
    rescue PG::Error => e
      @errors[app.adapter] += 1
      conns.delete(app.adapter)&.close rescue nil # rubocop:disable Style/RescueModifier
      @backends.delete(app.adapter)
      @log.call("publish #{seq} to #{app.adapter} failed: #{e.message.lines.first&.strip}") if @errors[app.adapter] % 20 == 1
    end
  end
end
