//! Hub sockets left behind by a hub that died without unlinking (`kill -9`):
//! a starting hub removes those beside its own socket; `pgbus-hub status`
//! skips and names them.

use super::socket_file_name;
use crate::log::LogSink;
use crate::os;
use crate::transport::socket::REFUSED_BUT_MAYBE_BUSY;
use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The stale hub sockets in `dir` (`pgbus-streams-hub-*.sock`), sorted. One
/// named for a master pid is stale once that process is gone: its forked
/// workers may still hold the listening descriptor, so a connect could
/// succeed, and a live master's socket is never connected to. One with
/// another name (`serve`'s) is stale once nothing answers on it (looked at
/// twice where a refusal may mean a busy hub: [`connect_looking_twice`]).
pub fn stale_sockets(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let (prefix, suffix) = socket_file_name("*")
        .split_once('*')
        .map(|(p, s)| (p.to_owned(), s.to_owned()))
        .expect("the socket name has a pid slot");
    let mut stale: Vec<PathBuf> = entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_socket()))
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let id = name
                .strip_prefix(&prefix)?
                .strip_suffix(&suffix)?
                .to_owned();
            let path = entry.path();
            let gone = match id.parse::<libc::pid_t>() {
                Ok(pid) if pid > 0 => process_gone(pid),
                _ => nothing_answers(&path),
            };
            gone.then_some(path)
        })
        .collect();
    stale.sort();
    stale
}

/// Unlinks the stale hub sockets in `dir` (one that vanished meanwhile is
/// skipped), logging each.
pub fn remove_stale_sockets(dir: &Path, log: &LogSink) {
    for path in stale_sockets(dir) {
        match std::fs::remove_file(&path) {
            Ok(()) => log.info(format!("removed a stale hub socket: {}", path.display())),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => log.warn(format!(
                "cannot remove the stale hub socket {}: {e}",
                path.display()
            )),
        }
    }
}

fn process_gone(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only asks whether `pid` exists; EPERM means it does (someone else's).
    let alive = unsafe { libc::kill(pid, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    !alive
}

fn nothing_answers(path: &Path) -> bool {
    matches!(
        connect_looking_twice(path).map_err(|e| e.kind()),
        Err(ErrorKind::ConnectionRefused | ErrorKind::NotFound)
    )
}

/// A blocking connect to a hub socket, to see whether anyone accepts there.
/// Where a refusal may be a live hub's full backlog (macOS, the BSDs; see
/// [`os::refusal_may_be_busy`]) a refused one is tried once more after
/// [`REFUSED_BUT_MAYBE_BUSY`]: a hub that accepts at all has drained its
/// backlog by then, so only a socket nobody listens on is refused twice.
pub(super) fn connect_looking_twice(path: &Path) -> std::io::Result<UnixStream> {
    match UnixStream::connect(path) {
        Err(e) if e.raw_os_error().is_some_and(os::refusal_may_be_busy) => {
            std::thread::sleep(REFUSED_BUT_MAYBE_BUSY);
            UnixStream::connect(path)
        }
        connected => connected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn only_sockets_of_gone_masters_and_unanswered_others_are_stale() {
        let dir = std::env::temp_dir().join(format!("pgbus-hub-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = |id: &str| dir.join(socket_file_name(id));
        // 999999999 is above any pid_max: no such process.
        for id in ["999999999", "serve", &std::process::id().to_string()] {
            drop(UnixListener::bind(path(id)).unwrap());
        }
        let _answering = UnixListener::bind(path("sidecar")).unwrap();
        std::fs::write(path("888888888"), "").unwrap(); // not a socket: never touched
        std::fs::write(dir.join("other.sock"), "").unwrap();

        assert_eq!(stale_sockets(&dir), vec![path("999999999"), path("serve")]);
        remove_stale_sockets(&dir, &LogSink::silent());
        assert!(stale_sockets(&dir).is_empty());
        for kept in ["sidecar", "888888888", &std::process::id().to_string()] {
            assert!(path(kept).exists(), "{kept} was removed");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A hub whose listen backlog is full (a reconnect storm) still owns its
    /// socket: Linux's blocking connect waits for the accept; where the full
    /// backlog refuses the connect, the second look finds the hub drained it.
    #[test]
    fn a_socket_whose_backlog_is_full_is_not_stale() {
        use std::os::fd::AsRawFd;
        let dir = std::env::temp_dir().join(format!("pgbus-hub-busy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(socket_file_name("serve"));
        let listener = UnixListener::bind(&path).unwrap();
        // SAFETY: a valid listening socket; backlog 0 holds the fewest connections.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
        let address = rustix::net::SocketAddrUnix::new(&path).unwrap();
        let mut queued = Vec::new();
        for _ in 0..1000 {
            let socket = os::unix_stream_socket().unwrap();
            if rustix::net::connect(&socket, &address).is_err() {
                break; // full: EAGAIN on Linux, ECONNREFUSED on macOS and the BSDs
            }
            queued.push(socket);
        }
        assert!(queued.len() < 1000, "the backlog never filled");
        let pending = queued.len() + 1; // the sweep's own connect
        let hub = std::thread::spawn(move || {
            // Busy for a moment (well within the second look), then accepting.
            std::thread::sleep(REFUSED_BUT_MAYBE_BUSY / 10);
            for _ in 0..pending {
                drop(listener.accept().unwrap());
            }
        });
        assert!(stale_sockets(&dir).is_empty());
        hub.join().unwrap();
        assert!(path.exists());
        drop(queued);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
