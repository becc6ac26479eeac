//! The hub's Unix socket: created private (mode 0600 from the first instant),
//! never replacing anything but a stale socket; the accept loop, which
//! checks every peer's uid and hands the router only our own.

use super::command::{Command, Commands};
use super::HubShared;
use crate::shutdown::Shutdown;
use crate::sync::lock;
use std::collections::HashSet;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

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
        Ok(_) => match super::stale::connect_looking_twice(path) {
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

/// True when a socket at `path` accepts a connection: another hub serves it.
pub(super) fn is_served(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_socket())
        && super::stale::connect_looking_twice(path).is_ok()
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

pub(super) async fn accept_loop(
    shared: Arc<HubShared>,
    unix: tokio::net::UnixListener,
    commands: Commands,
    mut shutdown: Shutdown,
) {
    /// Pause after accept(2) fails (EMFILE under an fd flood): retrying at once would spin.
    const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
    let own_uid = own_uid();
    let mut refused_uids = HashSet::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait() => return,
            accepted = unix.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                shared
                    .log
                    .warn(format!("accept on the hub socket failed: {e} — retrying"));
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let cred = stream.peer_cred();
        let peer_uid = cred
            .as_ref()
            .map(|cred| cred.uid())
            .map_err(|e| std::io::Error::from(e.kind()));
        if peer_uid.as_ref().ok() != Some(&own_uid) {
            refuse_peer(&shared, &mut refused_uids, &stream, peer_uid, own_uid);
            continue;
        }
        let peer_pid = cred.ok().and_then(|cred| cred.pid());
        if commands
            .send(Command::Accepted { stream, peer_pid })
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Counts every refused peer, logs each uid once (a hostile loop must not flood the log).
fn refuse_peer(
    shared: &HubShared,
    refused_uids: &mut HashSet<u32>,
    stream: &tokio::net::UnixStream,
    peer_uid: std::io::Result<u32>,
    own_uid: u32,
) {
    shared.rejected_peers.fetch_add(1, Ordering::Relaxed);
    let first_time = match &peer_uid {
        Ok(uid) => refused_uids.insert(*uid),
        Err(_) => true,
    };
    if first_time {
        let who = match peer_uid {
            Ok(uid) => format!("uid {uid}"),
            Err(e) => format!("an unidentifiable peer ({e})"),
        };
        shared.log.warn(format!(
            "refused a hub connection from {who}: the hub only serves uid {own_uid}"
        ));
    }
    sever(std::os::fd::AsRawFd::as_raw_fd(stream));
}
