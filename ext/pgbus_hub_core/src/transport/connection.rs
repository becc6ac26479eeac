//! The hub's side of a worker's connection, as tokio halves: the reader
//! decodes frames straight from the socket into its decoder's buffer; the
//! writer sends queued frames with vectored writes, so the bytes every
//! worker shares (one encoded wake) are never copied per worker.

use std::io::{self, IoSlice};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::protocol::{Decoder, Frame, Message, ProtocolError};

/// Frames handed to one writev(2): Linux allows 1024 (IOV_MAX); 64 typical
/// wakes already fill a socket buffer, and the slice list stays on one page.
const FRAMES_PER_WRITE: usize = 64;

/// Why a connection's reading ended.
#[derive(Debug)]
pub enum ReadEnd {
    /// EOF between frames.
    Closed,
    /// EOF or a reset with part of a frame buffered, or another read error.
    Broken(String),
    /// The peer started a frame and sent nothing more for this long.
    Stalled(Duration),
    Protocol(ProtocolError),
}

pub struct FrameReader {
    read: OwnedReadHalf,
    decoder: Decoder,
    /// A peer that starts a frame must finish it within this time.
    completion_timeout: Duration,
}

impl FrameReader {
    pub fn new(read: OwnedReadHalf, completion_timeout: Duration) -> Self {
        Self {
            read,
            decoder: Decoder::new(),
            completion_timeout,
        }
    }

    /// The next message; waits for more bytes as long as needed between
    /// frames, and at most `completion_timeout` inside one.
    pub async fn read_message(&mut self) -> Result<Message, ReadEnd> {
        loop {
            if let Some(message) = self.decoder.next_message().map_err(ReadEnd::Protocol)? {
                return Ok(message);
            }
            let partial = self.decoder.has_partial_frame();
            let read = &mut self.read;
            let received = {
                let reading = self.decoder.read_with_async(read);
                if partial {
                    tokio::time::timeout(self.completion_timeout, reading)
                        .await
                        .map_err(|_| ReadEnd::Stalled(self.completion_timeout))?
                } else {
                    reading.await
                }
            };
            match received {
                Ok(0) if partial => return Err(ReadEnd::Broken("closed mid-frame".into())),
                Ok(0) => return Err(ReadEnd::Closed),
                Ok(_) => {}
                Err(e) => return Err(ReadEnd::Broken(e.to_string())),
            }
        }
    }
}

pub struct FrameWriter {
    write: OwnedWriteHalf,
}

impl FrameWriter {
    pub fn new(write: OwnedWriteHalf) -> Self {
        Self { write }
    }

    /// Bytes written that the peer has not read yet (Linux: SIOCOUTQ, kernel
    /// overhead included). None if the OS does not say (see [`crate::os::unread_bytes`]).
    pub fn unread_bytes(&self) -> Option<usize> {
        // `self.write` keeps the descriptor open throughout.
        crate::os::unread_bytes(std::os::fd::AsRawFd::as_raw_fd(self.write.as_ref()))
    }

    /// Writes every frame, in order, sending the shared bytes as they are.
    pub async fn write_frames(&mut self, frames: &[Frame]) -> io::Result<()> {
        let (mut first, mut offset) = (0, 0);
        while first < frames.len() {
            let slices: Vec<IoSlice<'_>> = std::iter::once(&frames[first][offset..])
                .chain(frames[first + 1..].iter().map(|frame| &frame[..]))
                .take(FRAMES_PER_WRITE)
                .map(IoSlice::new)
                .collect();
            let mut written = self.write.write_vectored(&slices).await?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            while written > 0 {
                let left = frames[first].len() - offset;
                if written < left {
                    offset += written;
                    break;
                }
                written -= left;
                (first, offset) = (first + 1, 0);
            }
        }
        Ok(())
    }
}
