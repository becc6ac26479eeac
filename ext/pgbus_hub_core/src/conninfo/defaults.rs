//! libpq's defaults for what neither the options, a service nor the
//! environment give (Debian's socket directory and sysconfdir, the port, the
//! OS user), and where the per-user files live (the home directory).

use std::path::{Path, PathBuf};

use tokio_postgres::Config;

use super::{config_error, ConfigError};

/// Debian's libpq default socket directory; elsewhere libpq uses /tmp.
const DEBIAN_SOCKET_DIR: &str = "/var/run/postgresql";

/// Debian's libpq `sysconfdir` (`pg_config --sysconfdir`), where the
/// system-wide `pg_service.conf` is sought unless `PGSYSCONFDIR` names another.
pub(super) const DEBIAN_SYSCONFDIR: &str = "/etc/postgresql-common";

/// libpq's port when none is given (tokio-postgres uses the same).
pub(super) const DEFAULT_PORT: u16 = 5432;

/// libpq's per-user files, relative to the home directory.
pub(super) const USER_PASSFILE: &str = ".pgpass";
pub(super) const USER_SERVICEFILE: &str = ".pg_service.conf";

pub(super) fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// libpq's compiled-in defaults, for what neither the options, the service
/// nor the environment gave: the socket directory and the OS user.
pub(super) fn apply_compiled_defaults(config: &mut Config) -> Result<(), ConfigError> {
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        config.host(default_socket_dir());
    }
    if config.get_user().is_none() {
        let user =
            os_user().ok_or_else(|| config_error("no user given and the OS user is unknown"))?;
        config.user(&user);
    }
    Ok(())
}

/// The socket directory used when no host is given: Debian's libpq default
/// where it exists, else libpq's upstream /tmp.
pub(super) fn default_socket_dir() -> &'static str {
    if Path::new(DEBIAN_SOCKET_DIR).is_dir() {
        DEBIAN_SOCKET_DIR
    } else {
        "/tmp"
    }
}

/// The effective user's login name (libpq's default user).
fn os_user() -> Option<String> {
    passwd_field(|entry| entry.pw_name)
        .or_else(|| env_nonempty("USER"))
        .or_else(|| env_nonempty("LOGNAME"))
}

/// The home directory for `~/.pgpass`, `~/.pg_service.conf` and
/// `~/.postgresql/`: `HOME`, else the effective user's passwd entry (libpq's order).
pub(super) fn home_dir() -> Option<PathBuf> {
    env_nonempty("HOME")
        .or_else(|| passwd_field(|entry| entry.pw_dir))
        .map(PathBuf::from)
}

/// One string field of the effective user's passwd entry.
fn passwd_field(field: fn(&libc::passwd) -> *mut libc::c_char) -> Option<String> {
    let mut buffer = vec![0 as libc::c_char; 4096];
    // SAFETY: a zeroed passwd is a valid out-parameter for getpwuid_r.
    let mut passwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call; buffer outlives the use of passwd.
    let rc = unsafe {
        libc::getpwuid_r(
            libc::geteuid(),
            &mut passwd,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut result,
        )
    };
    let pointer = field(&passwd);
    if rc != 0 || result.is_null() || pointer.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded, the field points at a NUL-terminated string in buffer.
    let text = unsafe { std::ffi::CStr::from_ptr(pointer) };
    Some(text.to_string_lossy().into_owned())
}
