//! The framed connection between the hub and a worker, for each side's I/O
//! model: the hub's workers are tokio tasks ([`connection`]); the client is
//! driven by whichever thread waits for wakes, over a non-blocking socket
//! ([`socket`]). Both read
//! into a [`crate::protocol::Decoder`]'s buffer and write whole frames. (The
//! binding's `Protocol.read_frame` reads through a Ruby IO, so it shares only
//! the framing functions in [`crate::protocol`].)

pub mod connection;
pub mod socket;

use std::path::Path;

/// Size of `sockaddr_un.sun_path` (108 on Linux); a path needs one byte less
/// (the terminating NUL).
pub const SUN_PATH_BYTES: usize = {
    // SAFETY: sockaddr_un is plain old data; an all-zero value is valid.
    let addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_path.len()
};

/// Whether `path` can name a Unix socket at all (both sides check it first,
/// so the reason is the same wherever a too-long path is configured).
pub fn check_socket_path(path: &Path) -> Result<(), String> {
    let length = path.as_os_str().len();
    if length == 0 {
        return Err("the socket path is empty".into());
    }
    if length >= SUN_PATH_BYTES {
        return Err(format!(
            "the socket path {} is {length} bytes; a Unix socket path must be shorter than {SUN_PATH_BYTES} bytes (sun_path)",
            path.display()
        ));
    }
    Ok(())
}
