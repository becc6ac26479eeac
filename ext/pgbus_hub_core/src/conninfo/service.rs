//! libpq's connection service files: `[name]` sections of `keyword=value`
//! lines, `#` comments. The per-user file is searched first, then the
//! system-wide one; the first file holding the section is the only one read.

use std::path::{Path, PathBuf};

use super::defaults::{env_nonempty, home_dir, DEBIAN_SYSCONFDIR, USER_SERVICEFILE};
use super::{config_error, ConfigError};

/// The keyword/value pairs of service `name` and the file they came from.
/// A service found in neither file is an error, as in libpq.
pub(super) fn lookup(
    name: &str,
    files: &[PathBuf],
) -> Result<(Vec<(String, String)>, PathBuf), ConfigError> {
    for file in files {
        // A missing file is skipped, as libpq does.
        let Ok(text) = std::fs::read_to_string(file) else {
            if file.exists() {
                return Err(config_error(format!(
                    "service file \"{}\" cannot be read",
                    file.display()
                )));
            }
            continue;
        };
        if let Some(pairs) = section(&text, name, file)? {
            return Ok((pairs, file.clone()));
        }
    }
    let searched: Vec<String> = files
        .iter()
        .map(|f| format!("\"{}\"", f.display()))
        .collect();
    Err(config_error(format!(
        "definition of service \"{name}\" not found (searched {})",
        searched.join(", ")
    )))
}

/// The pairs of section `[name]` in `text`, or None if it has no such section.
fn section(
    text: &str,
    name: &str,
    file: &Path,
) -> Result<Option<Vec<(String, String)>>, ConfigError> {
    let mut pairs: Option<Vec<(String, String)>> = None;
    for (index, raw_line) in text.lines().enumerate() {
        let line = raw_line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(header) = line.strip_prefix('[') {
            if pairs.is_some() {
                break;
            }
            // libpq compares up to the `]` and ignores what follows it.
            if header
                .strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(']'))
            {
                pairs = Some(Vec::new());
            }
            continue;
        }
        let Some(pairs) = pairs.as_mut() else {
            continue;
        };
        let line_error = |what: &str| {
            config_error(format!(
                "{what} in service file \"{}\", line {}",
                file.display(),
                index + 1
            ))
        };
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| line_error("syntax error"))?;
        if key == "service" {
            return Err(line_error("nested service specifications not supported"));
        }
        pairs.push((key.to_string(), value.to_string()));
    }
    Ok(pairs)
}

/// The pairs of the `service` named in `given` (else `PGSERVICE`) that
/// `given` does not set itself, and where they came from; None without a service.
#[allow(clippy::type_complexity)]
pub(super) fn pairs_for(
    given: &[(String, String)],
) -> Result<Option<(String, Vec<(String, String)>)>, ConfigError> {
    let last = |name: &str| {
        given
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    let Some(name) = last("service").or_else(|| env_nonempty("PGSERVICE")) else {
        return Ok(None);
    };
    // PostgreSQL 18's `servicefile` keyword, else PGSERVICEFILE, else ~/.pg_service.conf.
    let user_file = last("servicefile")
        .or_else(|| env_nonempty("PGSERVICEFILE"))
        .map(PathBuf::from)
        .or_else(|| home_dir().map(|home| home.join(USER_SERVICEFILE)));
    let system_file = PathBuf::from(
        env_nonempty("PGSYSCONFDIR").unwrap_or_else(|| DEBIAN_SYSCONFDIR.to_string()),
    )
    .join("pg_service.conf");
    let files: Vec<PathBuf> = user_file.into_iter().chain([system_file]).collect();
    let (pairs, file) = lookup(&name, &files)?;
    let origin = format!("from service \"{name}\" in \"{}\"", file.display());
    let unset = pairs
        .into_iter()
        .filter(|(key, value)| !value.is_empty() && !given.iter().any(|(g, _)| g == key))
        .collect();
    Ok(Some((origin, unset)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn reads_only_the_named_section() {
        let text = "# comment\n[other]\nhost=elsewhere\n\n  [mydb]  \nhost=db.example\n  port=5433\n# note\ndbname=app\n[after]\nuser=x\n";
        let file = Path::new("f");
        assert_eq!(
            section(text, "mydb", file).unwrap(),
            Some(pairs(&[
                ("host", "db.example"),
                ("port", "5433"),
                ("dbname", "app")
            ]))
        );
        assert_eq!(section(text, "my", file).unwrap(), None);
        assert_eq!(section(text, "absent", file).unwrap(), None);
    }

    #[test]
    fn syntax_errors_and_nested_services_name_the_line() {
        let file = Path::new("svc.conf");
        let error = section("[a]\nhost\n", "a", file).unwrap_err().to_string();
        assert!(
            error.contains("syntax error in service file \"svc.conf\", line 2"),
            "{error}"
        );
        let error = section("[a]\nservice=b\n", "a", file)
            .unwrap_err()
            .to_string();
        assert!(error.contains("nested service"), "{error}");
        // Errors outside the wanted section do not matter.
        assert!(section("[b]\nbroken\n[a]\nhost=h\n", "a", file).is_ok());
    }

    #[test]
    fn user_file_first_then_system_and_missing_is_an_error() {
        let dir = std::env::temp_dir().join(format!("pgbus-hub-service-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let user = dir.join("user.conf");
        let system = dir.join("pg_service.conf");
        std::fs::write(&user, "[both]\nhost=user\n").unwrap();
        std::fs::write(&system, "[both]\nhost=system\n[sys]\nport=1\n").unwrap();
        let files = [dir.join("absent.conf"), user.clone(), system.clone()];
        assert_eq!(
            lookup("both", &files).unwrap(),
            (pairs(&[("host", "user")]), user)
        );
        assert_eq!(
            lookup("sys", &files).unwrap(),
            (pairs(&[("port", "1")]), system)
        );
        let error = lookup("nope", &files).unwrap_err().to_string();
        assert!(
            error.contains("definition of service \"nope\" not found"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
