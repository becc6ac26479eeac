//! libpq's password file (`passfile`, `PGPASSFILE`, `~/.pgpass`): lines of
//! `hostname:port:database:username:password`, `*` matching anything, `\`
//! escaping `:` and `\`, `#` starting a comment line. The first matching line wins.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use tokio_postgres::config::Host;
use tokio_postgres::Config;

use super::defaults::{default_socket_dir, DEFAULT_PORT};
use super::syntax::host_text;
use super::{config_error, ConfigError};

/// What one connection attempt is matched on, as libpq spells it: the
/// `host` (else `hostaddr`; a socket directory that is the default one is
/// `localhost`), the port as text, the database (defaulting to the user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PassTarget {
    pub host: String,
    pub port: String,
    pub dbname: String,
    pub user: String,
}

/// The file's text; None if it does not exist (silently, as libpq); the
/// reason (also logged as a warning) if libpq would ignore it: not a plain
/// file, or group or world can access it.
pub(super) fn read(path: &Path) -> Result<Option<String>, String> {
    let Ok(metadata) = std::fs::metadata(path) else {
        return Ok(None);
    };
    let shown = path.display();
    let problem = if !metadata.is_file() {
        format!("password file \"{shown}\" is not a plain file; ignored")
    } else if metadata.mode() & 0o077 != 0 {
        format!(
            "password file \"{shown}\" has group or world access; permissions should be u=rw (0600) or less; ignored"
        )
    } else {
        match std::fs::read_to_string(path) {
            Ok(text) => return Ok(Some(text)),
            Err(error) => format!("password file \"{shown}\" cannot be read ({error}); ignored"),
        }
    };
    log::warn!("{problem}");
    Err(problem)
}

/// The first line of `text` matching `target`, its password field.
pub(super) fn find_password(text: &str, target: &PassTarget) -> Option<String> {
    let wanted = [
        target.host.as_str(),
        &target.port,
        &target.dbname,
        &target.user,
    ];
    text.lines()
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .find_map(|line| {
            let fields = split_fields(line);
            // Four matched fields and a password (which may be empty).
            let (password, keys) = fields.get(4).map(|p| (p, &fields[..4]))?;
            keys.iter()
                .zip(wanted)
                .all(|(field, value)| field.is_wildcard || field.text == value)
                .then(|| password.text.clone())
        })
}

struct Field {
    text: String,
    /// A bare `*` (an escaped `\*` is a literal star).
    is_wildcard: bool,
}

fn split_fields(line: &str) -> Vec<Field> {
    let mut fields = Vec::new();
    let mut text = String::new();
    let mut raw = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ':' => fields.push(finish_field(&mut text, &mut raw)),
            '\\' => {
                raw.push(c);
                if let Some(next) = chars.next() {
                    raw.push(next);
                    text.push(next);
                }
            }
            _ => {
                raw.push(c);
                text.push(c);
            }
        }
    }
    fields.push(finish_field(&mut text, &mut raw));
    fields
}

fn finish_field(text: &mut String, raw: &mut String) -> Field {
    let field = Field {
        is_wildcard: raw == "*",
        text: std::mem::take(text),
    };
    raw.clear();
    field
}

/// The password file's password for this connection, or None. libpq looks
/// it up per host; tokio-postgres sends one password to every host, so
/// hosts the file gives different passwords (or a password for some only)
/// are refused rather than one host's password sent to another.
pub(super) fn password_for_hosts(
    config: &Config,
    text: &str,
    path: &Path,
) -> Result<Option<String>, ConfigError> {
    let user = config.get_user().unwrap_or_default();
    let dbname = config.get_dbname().unwrap_or(user);
    let ports = config.get_ports();
    let count = config.get_hosts().len().max(config.get_hostaddrs().len());
    let mut found: Vec<Option<String>> = (0..count)
        .map(|i| {
            let host = match config.get_hosts().get(i) {
                // libpq matches its default socket directory as `localhost`.
                Some(Host::Unix(dir)) if dir.as_path() == Path::new(default_socket_dir()) => {
                    "localhost".to_string()
                }
                Some(host) => host_text(host),
                None => config.get_hostaddrs()[i].to_string(),
            };
            let port = ports
                .get(i)
                .or(ports.first())
                .copied()
                .unwrap_or(DEFAULT_PORT);
            let target = PassTarget {
                host,
                port: port.to_string(),
                dbname: dbname.to_string(),
                user: user.to_string(),
            };
            find_password(text, &target)
        })
        .collect();
    found.dedup();
    match found.as_slice() {
        [] | [None] => Ok(None),
        [Some(password)] => Ok(Some(password.clone())),
        _ => Err(config_error(format!(
            "password file \"{}\" gives this connection's hosts different passwords (or some none); \
             pgbus-hub sends one password to every host: give `password`, or lines that agree",
            path.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(host: &str, port: &str, dbname: &str, user: &str) -> PassTarget {
        PassTarget {
            host: host.into(),
            port: port.into(),
            dbname: dbname.into(),
            user: user.into(),
        }
    }

    #[test]
    fn first_matching_line_wins_with_wildcards_and_comments() {
        let text = "# comment\n\
                    db.example:5432:app:alice:first\n\
                    *:5432:*:alice:second\n\
                    *:*:*:*:fallback\r\n";
        let find = |t| find_password(text, &t);
        assert_eq!(
            find(target("db.example", "5432", "app", "alice")).as_deref(),
            Some("first")
        );
        assert_eq!(
            find(target("other", "5432", "x", "alice")).as_deref(),
            Some("second")
        );
        assert_eq!(
            find(target("other", "6543", "x", "bob")).as_deref(),
            Some("fallback")
        );
    }

    #[test]
    fn backslash_escapes_colons_backslashes_and_stars() {
        let text = "h:5432:d:u\\:x:pa\\:ss\\\\word:ignored\n\\*:5432:d:u:star\n";
        assert_eq!(
            find_password(text, &target("h", "5432", "d", "u:x")).as_deref(),
            Some("pa:ss\\word")
        );
        // `\*` is a literal star, not a wildcard.
        assert_eq!(find_password(text, &target("h", "5432", "d", "u")), None);
        assert_eq!(
            find_password(text, &target("*", "5432", "d", "u")).as_deref(),
            Some("star")
        );
    }

    #[test]
    fn lines_without_a_password_field_never_match() {
        assert_eq!(
            find_password("h:5432:d:u\n", &target("h", "5432", "d", "u")),
            None
        );
        assert_eq!(
            find_password("h:5432:d:u:\n", &target("h", "5432", "d", "u")).as_deref(),
            Some("")
        );
    }
}
