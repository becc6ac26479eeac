//! The hub's Unix socket: created private (mode 0600 from the first instant),
//! never replacing anything but a stale socket, and peers checked by uid.

use crate::sync::lock;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Mutex;

/// Backlog for `listen(2)`: a phased restart reconnects every worker at once;
/// 1024 covers far more workers than one host runs (the kernel caps it at somaxconn).
pub const ACCEPT_BACKLOG: i32 = 1024;

/// umask is process-wide; this keeps two hubs in one process from racing on it.
static UMASK_LOCK: Mutex<()> = Mutex::new(());

/// Identity of the socket file we created, so stop unlinks only our own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketFile {
    dev: u64,
    ino: u64,
}

impl SocketFile {
    /// Removes `path` only if it is still the socket we bound.
    pub fn unlink_if_ours(self, path: &Path) {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if meta.dev() == self.dev && meta.ino() == self.ino {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// Binds `path` with mode 0600. Refuses a path that is not a socket or a
/// socket another process still accepts on; replaces a stale socket.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile), String> {
    crate::transport::check_socket_path(path)?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(format!(
                "refusing to replace {}: it exists and is not a socket",
                path.display()
            ));
        }
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(format!(
                    "another process is already serving {}",
                    path.display()
                ))
            }
            Err(_) => std::fs::remove_file(path)
                .map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?,
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot inspect {}: {e}", path.display())),
    }

    let listener = {
        let _guard = lock(&UMASK_LOCK);
        // SAFETY: umask only swaps the process file-mode mask; restored right after bind.
        let previous = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(path);
        unsafe { libc::umask(previous) };
        bound.map_err(|e| format!("cannot bind {}: {e}", path.display()))?
    };
    set_backlog(&listener);
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
    Ok((
        listener,
        SocketFile {
            dev: meta.dev(),
            ino: meta.ino(),
        },
    ))
}

fn set_backlog(listener: &UnixListener) {
    use std::os::fd::AsRawFd;
    // std listens with a backlog of 128; listen(2) again only raises it.
    // SAFETY: a valid listening socket fd owned by `listener`.
    unsafe { libc::listen(listener.as_raw_fd(), ACCEPT_BACKLOG) };
}

/// The effective uid peers must share.
pub fn own_uid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

/// Severs a socket for every process holding a copy of it. Puma forks workers
/// from the master, so a newer worker can hold a duplicate of the master's end
/// of an older worker's connection; a plain close would never deliver EOF.
pub fn sever(fd: std::os::fd::RawFd) {
    // SAFETY: callers pass an fd they still own; shutdown does not close it.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}
