//! The two ways libpq options are written: a URL (`postgres://...`,
//! percent-encoded query parameters) and a keyword string (`key = value`
//! pairs, values bare or `'quoted'`); both become keyword pairs.

use std::str::FromStr;

use tokio_postgres::config::Host;
use tokio_postgres::Config;

use super::{config_error, ConfigError};

/// A URL as keyword pairs, so that it goes through the same checks, service
/// lookup and defaults as a keyword string. tokio-postgres reads the part
/// before `?` (user, password, hosts, ports, database); what it found there
/// is what the URL gave.
pub(super) fn url_pairs(url: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let parsed = Config::from_str(base).map_err(|e| config_error(e.to_string()))?;
    let mut pairs = Vec::new();
    let mut push = |key: &str, value: String| pairs.push((key.to_string(), value));
    let hosts: Vec<String> = parsed.get_hosts().iter().map(host_text).collect();
    push("host", hosts.join(","));
    let ports: Vec<String> = parsed.get_ports().iter().map(u16::to_string).collect();
    push("port", ports.join(","));
    push("user", parsed.get_user().unwrap_or_default().to_string());
    let password = parsed.get_password().unwrap_or_default();
    push(
        "password",
        String::from_utf8(password.to_vec())
            .map_err(|_| config_error("the password in the URL is not valid UTF-8"))?,
    );
    push(
        "dbname",
        parsed.get_dbname().unwrap_or_default().to_string(),
    );
    for param in query.split('&').filter(|param| !param.is_empty()) {
        let (raw_key, raw_value) = param.split_once('=').unwrap_or((param, ""));
        push(&percent_decode(raw_key)?, percent_decode(raw_value)?);
    }
    Ok(pairs)
}

pub(super) fn host_text(host: &Host) -> String {
    match host {
        Host::Tcp(name) => name.clone(),
        Host::Unix(path) => path.display().to_string(),
    }
}

fn percent_decode(raw: &str) -> Result<String, ConfigError> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| config_error("malformed percent-encoding in URL"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| config_error("URL parameter is not valid UTF-8"))
}

/// libpq keyword string: `key = value` pairs separated by whitespace; a value
/// is bare or `'single-quoted'`, with `\` escaping the next character.
/// Names the offending word only when it looks like a keyword: anything else
/// may be a URL with a password or a stray password, and errors get logged.
fn missing_equals(word: &str) -> String {
    if let Some((scheme, _)) = word.split_once("://") {
        return format!(
            "unknown URL scheme \"{scheme}://\" in connection string (use postgres:// or postgresql://)"
        );
    }
    if word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        format!("missing \"=\" after {word:?} in connection string")
    } else {
        format!(
            "missing \"=\" after a word of {} characters in connection string (not shown: it may be a secret)",
            word.chars().count()
        )
    }
}

pub(super) fn parse_keywords(s: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut pairs = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(config_error(missing_equals(&key)));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => {
                        return Err(config_error(format!(
                            "unterminated quoted value for {key:?} in connection string"
                        )))
                    }
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyword_strings_accept_quotes_escapes_and_spaces_around_equals() {
        let pairs = parse_keywords("host = /tmp  password='a b\\'c' user=x\\ y").unwrap();
        assert_eq!(
            pairs,
            vec![
                ("host".to_string(), "/tmp".to_string()),
                ("password".to_string(), "a b'c".to_string()),
                ("user".to_string(), "x y".to_string()),
            ]
        );
    }
}
