//! libpq-style connection options (URL, keyword string, keyword pairs) turned
//! into a tokio-postgres [`Config`] plus a TLS connector: parsing and libpq's
//! defaults here; TLS in [`tls`], opening a connection in [`connect`], SQL
//! quoting in [`quote`].

mod connect;
mod quote;
mod tls;

use std::fmt;
use std::str::FromStr;

use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::Config;
use tokio_postgres_rustls::MakeRustlsConnect;

pub use connect::{describe, ConnectError, Connected, ServerMessage, DEFAULT_CONNECT_TIMEOUT};
pub use quote::{quote_ident, quote_literal, QuoteError};
pub use tls::{PgConnection, TlsPolicy};

/// The census tag operators count in `pg_stat_activity` (pgbus's `APP_NAME`),
/// used unless the options name an `application_name` themselves.
pub const DEFAULT_APPLICATION_NAME: &str = "pgbus-listen";

/// Debian's libpq default socket directory; elsewhere libpq uses /tmp.
const DEBIAN_SOCKET_DIR: &str = "/var/run/postgresql";

/// Keywords tokio-postgres understands; passed through to its parser.
const PASSTHROUGH_KEYWORDS: &[&str] = &[
    "user",
    "password",
    "dbname",
    "options",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
    "sslnegotiation",
];

/// libpq keywords this client cannot honour; refused by name rather than
/// silently ignored (ignoring `sslrootcert` would downgrade security).
const UNSUPPORTED_KEYWORDS: &[&str] = &[
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcrl",
    "sslcrldir",
    "sslcertmode",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "sslcompression",
    "requiressl",
    "gsslib",
    "gssdelegation",
    "krbsrvname",
    "service",
    "passfile",
    "requirepeer",
    "require_auth",
    "replication",
];

/// A connection string or option set that cannot be used. Never contains a password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid connection options: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

fn config_error(message: impl Into<String>) -> ConfigError {
    ConfigError(message.into())
}

/// Everything needed to (re)open the listener's connection.
#[derive(Clone)]
pub struct ConnectionOptions {
    config: Config,
    tls: TlsPolicy,
    connector: MakeRustlsConnect,
    variables: Vec<(String, String)>,
    /// `gssencmode` as given (disable or prefer): shown in the debug log line,
    /// since it changes nothing here.
    gssencmode: Option<String>,
}

impl ConnectionOptions {
    /// A libpq URL (`postgres://` / `postgresql://`, query parameters such as
    /// `sslmode`, `application_name`, `host=/socket/dir`) or a libpq keyword
    /// string (`host=... dbname=...`, values optionally `'quoted'`).
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let trimmed = s.trim();
        if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
            Self::parse_url(trimmed)
        } else {
            Self::from_pairs(parse_keywords(trimmed)?)
        }
    }

    /// libpq keyword/value pairs (a Ruby Hash, stringified). Empty values are
    /// ignored, as libpq does. Unknown keywords are refused by name.
    pub fn from_pairs(pairs: Vec<(String, String)>) -> Result<Self, ConfigError> {
        let mut passthrough = String::new();
        let mut intercepted = Intercepted::default();
        for (key, value) in pairs {
            if value.is_empty() {
                continue;
            }
            if intercepted.take(&key, &value)? {
                continue;
            }
            check_keyword(&key)?;
            passthrough.push_str(&key);
            passthrough.push_str("='");
            passthrough.push_str(&value.replace('\\', "\\\\").replace('\'', "\\'"));
            passthrough.push_str("' ");
        }
        let config = Config::from_str(&passthrough).map_err(|e| config_error(e.to_string()))?;
        intercepted.finish(config)
    }

    fn parse_url(url: &str) -> Result<Self, ConfigError> {
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, Some(query)),
            None => (url, None),
        };
        let mut intercepted = Intercepted::default();
        let mut kept: Vec<&str> = Vec::new();
        for param in query.into_iter().flat_map(|q| q.split('&')) {
            if param.is_empty() {
                continue;
            }
            let (raw_key, raw_value) = param.split_once('=').unwrap_or((param, ""));
            let key = percent_decode(raw_key)?;
            let value = percent_decode(raw_value)?;
            if value.is_empty() || intercepted.take(&key, &value)? {
                continue;
            }
            check_keyword(&key)?;
            kept.push(param);
        }
        let rebuilt = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let config = Config::from_str(&rebuilt).map_err(|e| config_error(e.to_string()))?;
        intercepted.finish(config)
    }

    /// After every connect, `SET name = 'value'` for each pair, in order
    /// (pgbus's DedicatedConnection `:variables`). Names may be dotted
    /// (`myext.setting`): each part is quoted as an identifier.
    pub fn with_variables(mut self, variables: Vec<(String, String)>) -> Result<Self, ConfigError> {
        for (name, value) in &variables {
            if name.is_empty() || name.split('.').any(str::is_empty) {
                return Err(config_error(format!("invalid variable name {name:?}")));
            }
            if name.contains('\0') || value.contains('\0') {
                return Err(config_error(format!(
                    "variable {name:?} contains a NUL byte"
                )));
            }
        }
        self.variables = variables;
        Ok(self)
    }

    /// The same options for another database.
    pub fn with_dbname(mut self, dbname: &str) -> Self {
        self.config.dbname(dbname);
        self
    }

    /// The same options with an explicit `application_name` (replacing the census tag).
    pub fn with_application_name(mut self, application_name: &str) -> Self {
        self.config.application_name(application_name);
        self
    }

    /// The `SET` statements run after connecting (one simple-query batch).
    pub fn variables_sql(&self) -> Result<String, QuoteError> {
        let mut sql = String::new();
        for (name, value) in &self.variables {
            let parts = name
                .split('.')
                .map(quote_ident)
                .collect::<Result<Vec<_>, _>>()?;
            sql.push_str(&format!(
                "SET {} = {};\n",
                parts.join("."),
                quote_literal(value)?
            ));
        }
        Ok(sql)
    }

    pub fn variables(&self) -> &[(String, String)] {
        &self.variables
    }

    pub fn application_name(&self) -> &str {
        self.config
            .get_application_name()
            .unwrap_or(DEFAULT_APPLICATION_NAME)
    }

    pub fn tls_policy(&self) -> TlsPolicy {
        self.tls
    }

    /// The underlying tokio-postgres configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }
}

/// Keywords this module handles itself instead of tokio-postgres.
#[derive(Default)]
struct Intercepted {
    sslmode: Option<TlsPolicy>,
    gssencmode: Option<String>,
    application_name: Option<String>,
    fallback_application_name: Option<String>,
}

impl Intercepted {
    /// True if `key` was one of ours.
    fn take(&mut self, key: &str, value: &str) -> Result<bool, ConfigError> {
        match key {
            "sslmode" => {
                self.sslmode = Some(parse_sslmode(value)?);
                Ok(true)
            }
            "gssencmode" => {
                self.gssencmode = Some(parse_gssencmode(value)?);
                Ok(true)
            }
            "application_name" => {
                self.application_name = Some(value.to_string());
                Ok(true)
            }
            "fallback_application_name" => {
                self.fallback_application_name = Some(value.to_string());
                Ok(true)
            }
            "client_encoding" => {
                // tokio-postgres always speaks UTF8; accept only that.
                if !matches!(
                    value.to_ascii_lowercase().as_str(),
                    "utf8" | "utf-8" | "unicode"
                ) {
                    return Err(config_error(format!(
                        "client_encoding {value:?} is not supported (only UTF8)"
                    )));
                }
                Ok(true)
            }
            "variables" => Err(config_error(
                "`variables` is not a connection keyword; pass it separately",
            )),
            _ => Ok(false),
        }
    }

    fn finish(self, mut config: Config) -> Result<ConnectionOptions, ConfigError> {
        apply_libpq_defaults(&mut config)?;
        let application_name = self
            .application_name
            .or_else(|| env_nonempty("PGAPPNAME"))
            .or(self.fallback_application_name)
            .unwrap_or_else(|| DEFAULT_APPLICATION_NAME.to_string());
        config.application_name(&application_name);
        let mut tls = match self.sslmode {
            Some(mode) => mode,
            None => match env_nonempty("PGSSLMODE") {
                Some(mode) => parse_sslmode(&mode)?,
                None => TlsPolicy::Prefer,
            },
        };
        // libpq never uses TLS over a Unix socket (the kernel is the transport).
        let all_unix = !config.get_hosts().is_empty()
            && config.get_hostaddrs().is_empty()
            && config
                .get_hosts()
                .iter()
                .all(|host| matches!(host, Host::Unix(_)));
        if all_unix {
            tls = TlsPolicy::Disable;
        }
        config.ssl_mode(match tls {
            TlsPolicy::Disable => SslMode::Disable,
            TlsPolicy::Prefer => SslMode::Prefer,
            TlsPolicy::Require => SslMode::Require,
        });
        // libpq reads PGGSSENCMODE when the options say nothing: refuse `require` there too.
        let gssencmode = match self.gssencmode {
            Some(mode) => Some(mode),
            None => env_nonempty("PGGSSENCMODE")
                .map(|mode| parse_gssencmode(&mode))
                .transpose()?,
        };
        Ok(ConnectionOptions {
            config,
            tls,
            connector: tls::make_tls()?,
            variables: Vec::new(),
            gssencmode,
        })
    }
}

fn parse_sslmode(value: &str) -> Result<TlsPolicy, ConfigError> {
    match value {
        "disable" => Ok(TlsPolicy::Disable),
        // libpq's allow tries plain first, then TLS; prefer connects in the
        // same cases and encrypts when it can.
        "allow" | "prefer" => Ok(TlsPolicy::Prefer),
        "require" => Ok(TlsPolicy::Require),
        "verify-ca" | "verify-full" => Err(config_error(format!(
            "sslmode={value} is not supported: pgbus-hub encrypts (sslmode=require) but does not \
             verify server certificates; use sslmode=require, or a TLS-terminating proxy you trust"
        ))),
        other => Err(config_error(format!(
            "invalid sslmode {other:?} (expected disable, allow, prefer, require)"
        ))),
    }
}

/// pgbus-hub never uses GSSAPI encryption: `disable` and `prefer` (libpq's
/// default, which falls back to no GSS encryption) connect exactly as without
/// the option; `require` cannot be honoured and is refused.
fn parse_gssencmode(value: &str) -> Result<String, ConfigError> {
    match value {
        "disable" | "prefer" => Ok(value.to_string()),
        "require" => Err(config_error(
            "gssencmode=require is not supported: pgbus-hub never uses GSS encryption \
             (use gssencmode=disable or prefer, or leave it out; TLS is sslmode)",
        )),
        other => Err(config_error(format!(
            "invalid gssencmode {other:?} (expected disable, prefer or require)"
        ))),
    }
}

fn check_keyword(key: &str) -> Result<(), ConfigError> {
    if PASSTHROUGH_KEYWORDS.contains(&key) {
        Ok(())
    } else if UNSUPPORTED_KEYWORDS.contains(&key) {
        Err(config_error(format!(
            "connection option `{key}` is not supported by pgbus-hub"
        )))
    } else {
        Err(config_error(format!("unknown connection option `{key}`")))
    }
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// What libpq fills in when the options leave it out: PG* environment
/// variables, then the compiled-in defaults (socket directory, OS user).
fn apply_libpq_defaults(config: &mut Config) -> Result<(), ConfigError> {
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        match env_nonempty("PGHOST") {
            Some(hosts) => {
                for host in hosts.split(',') {
                    config.host(host);
                }
            }
            None if std::path::Path::new(DEBIAN_SOCKET_DIR).is_dir() => {
                config.host(DEBIAN_SOCKET_DIR);
            }
            None => {
                config.host("/tmp");
            }
        }
    }
    if config.get_ports().is_empty() {
        if let Some(port) = env_nonempty("PGPORT") {
            let port = port
                .parse::<u16>()
                .map_err(|_| config_error("PGPORT is not a port number"))?;
            config.port(port);
        }
    }
    if config.get_user().is_none() {
        match env_nonempty("PGUSER").or_else(os_user) {
            Some(user) => {
                config.user(&user);
            }
            None => return Err(config_error("no user given and the OS user is unknown")),
        }
    }
    if config.get_dbname().is_none() {
        if let Some(dbname) = env_nonempty("PGDATABASE") {
            config.dbname(&dbname);
        }
    }
    if config.get_password().is_none() {
        if let Some(password) = env_nonempty("PGPASSWORD") {
            config.password(&password);
        }
    }
    Ok(())
}

/// The effective user's login name (libpq's default user).
fn os_user() -> Option<String> {
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
    if rc != 0 || result.is_null() || passwd.pw_name.is_null() {
        return env_nonempty("USER").or_else(|| env_nonempty("LOGNAME"));
    }
    // SAFETY: getpwuid_r succeeded, pw_name points at a NUL-terminated string in buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(passwd.pw_name) };
    Some(name.to_string_lossy().into_owned())
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

fn parse_keywords(s: &str) -> Result<Vec<(String, String)>, ConfigError> {
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

impl fmt::Display for ConnectionOptions {
    /// `host=... port=... dbname=... user=... application_name=... sslmode=...`; never the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|host| match host {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            })
            .chain(self.config.get_hostaddrs().iter().map(|a| a.to_string()))
            .collect();
        write!(f, "host={}", hosts.join(","))?;
        let ports: Vec<String> = self.config.get_ports().iter().map(u16::to_string).collect();
        write!(
            f,
            " port={}",
            if ports.is_empty() {
                "5432".to_string()
            } else {
                ports.join(",")
            }
        )?;
        if let Some(dbname) = self.config.get_dbname() {
            write!(f, " dbname={dbname}")?;
        }
        if let Some(user) = self.config.get_user() {
            write!(f, " user={user}")?;
        }
        write!(f, " application_name={}", self.application_name())?;
        let mode = match self.tls {
            TlsPolicy::Disable => "disable",
            TlsPolicy::Prefer => "prefer",
            TlsPolicy::Require => "require",
        };
        write!(f, " sslmode={mode}")?;
        if let Some(gss) = &self.gssencmode {
            write!(f, " gssencmode={gss} (GSS encryption is never used)")?;
        }
        if self.config.get_password().is_some() {
            f.write_str(" password=[redacted]")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ConnectionOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.variables.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("ConnectionOptions")
            .field("target", &self.to_string())
            .field("variables", &names)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_never_echo_what_may_be_a_secret() {
        let error = |text: &str| ConnectionOptions::parse(text).unwrap_err().to_string();
        let typo = error("postgress://app:s3cret@db/app");
        assert!(
            typo.contains("unknown URL scheme \"postgress://\""),
            "{typo}"
        );
        assert!(!typo.contains("s3cret"), "{typo}");
        let stray = error("host=db user=app s3cret!");
        assert!(stray.contains("a word of 7 characters"), "{stray}");
        assert!(!stray.contains("s3cret"), "{stray}");
        assert!(error("host=db bogus").contains("missing \"=\" after \"bogus\""));
    }

    #[test]
    fn variables_sql_quotes_dotted_names_part_by_part() {
        let options = ConnectionOptions::parse("host=/tmp dbname=x user=u")
            .unwrap()
            .with_variables(vec![
                ("statement_timeout".into(), "5s".into()),
                ("myext.weird\"name".into(), "o'k".into()),
            ])
            .unwrap();
        assert_eq!(
            options.variables_sql().unwrap(),
            "SET \"statement_timeout\" = '5s';\nSET \"myext\".\"weird\"\"name\" = 'o''k';\n"
        );
        assert!(ConnectionOptions::parse("host=/tmp user=u")
            .unwrap()
            .with_variables(vec![("a..b".into(), "1".into())])
            .is_err());
    }

    #[test]
    fn application_name_defaults_to_the_census_tag_unless_set() {
        let default = ConnectionOptions::parse("host=/tmp user=u").unwrap();
        assert_eq!(default.application_name(), DEFAULT_APPLICATION_NAME);
        let url =
            ConnectionOptions::parse("postgres://u@localhost/db?application_name=mine").unwrap();
        assert_eq!(url.application_name(), "mine");
        let fallback =
            ConnectionOptions::parse("host=/tmp user=u fallback_application_name=fb").unwrap();
        assert_eq!(fallback.application_name(), "fb");
        let both = ConnectionOptions::from_pairs(vec![
            ("host".into(), "/tmp".into()),
            ("user".into(), "u".into()),
            ("fallback_application_name".into(), "fb".into()),
            ("application_name".into(), "app".into()),
        ])
        .unwrap();
        assert_eq!(both.application_name(), "app");
    }

    #[test]
    fn url_with_socket_dir_and_sslmode() {
        let options = ConnectionOptions::parse(
            "postgresql://root@/pgbus_hub_test?host=%2Fvar%2Frun%2Fpostgresql&sslmode=require",
        )
        .unwrap();
        assert!(matches!(options.config().get_hosts()[0], Host::Unix(_)));
        // TLS is never used over a Unix socket (libpq semantics).
        assert_eq!(options.tls_policy(), TlsPolicy::Disable);
        let tcp =
            ConnectionOptions::parse("postgres://root@127.0.0.1:5432/db?sslmode=require").unwrap();
        assert_eq!(tcp.tls_policy(), TlsPolicy::Require);
        assert_eq!(tcp.config().get_ports(), &[5432]);
    }

    #[test]
    fn verify_modes_and_unknown_keywords_are_clear_errors() {
        let err = ConnectionOptions::parse("host=h sslmode=verify-full").unwrap_err();
        assert!(
            err.to_string()
                .contains("sslmode=verify-full is not supported"),
            "{err}"
        );
        let err = ConnectionOptions::from_pairs(vec![("bogus".into(), "1".into())]).unwrap_err();
        assert!(err.to_string().contains("`bogus`"), "{err}");
        let err = ConnectionOptions::parse("postgres://h/db?sslrootcert=x").unwrap_err();
        assert!(err.to_string().contains("`sslrootcert`"), "{err}");
        assert!(ConnectionOptions::parse("host=h port=notaport").is_err());
        assert!(ConnectionOptions::parse("host='unterminated").is_err());
    }

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

    /// pgbus's own integration helper appends `gssencmode=disable` to every URL.
    #[test]
    fn gssencmode_disable_and_prefer_are_accepted_require_is_refused_by_name() {
        for (given, shown) in [
            ("postgres://u@h/db?gssencmode=disable", "gssencmode=disable"),
            ("host=h dbname=db gssencmode=prefer", "gssencmode=prefer"),
            (
                "postgres://u@h/db?gssencmode=disable&fallback_application_name=pgbus-listen",
                "gssencmode=disable",
            ),
        ] {
            let options = ConnectionOptions::parse(given).expect(given);
            assert!(options.to_string().contains(shown), "{given}: {options}");
            assert_eq!(options.application_name(), "pgbus-listen");
        }
        let pairs = ConnectionOptions::from_pairs(vec![
            ("host".into(), "h".into()),
            ("gssencmode".into(), "disable".into()),
        ])
        .expect("a Hash with gssencmode: disable");
        assert!(pairs.to_string().contains("gssencmode=disable"));
        for (given, expected) in [
            (
                "host=h gssencmode=require",
                "gssencmode=require is not supported",
            ),
            ("postgres://h/db?gssencmode=sometimes", "invalid gssencmode"),
        ] {
            let error = ConnectionOptions::parse(given).unwrap_err().to_string();
            assert!(error.contains(expected), "{given}: {error}");
        }
    }

    #[test]
    fn display_and_debug_never_show_the_password() {
        for options in [
            ConnectionOptions::parse("postgres://u:s3cr3t@localhost/db").unwrap(),
            ConnectionOptions::parse("host=localhost user=u password=s3cr3t").unwrap(),
            ConnectionOptions::from_pairs(vec![
                ("host".into(), "localhost".into()),
                ("password".into(), "s3cr3t".into()),
            ])
            .unwrap(),
        ] {
            let shown = format!("{options} {options:?}");
            assert!(!shown.contains("s3cr3t"), "{shown}");
            assert!(shown.contains("[redacted]"), "{shown}");
            assert_eq!(options.config().get_password(), Some(&b"s3cr3t"[..]));
        }
    }

    #[test]
    fn pairs_skip_empty_values_and_escape_the_rest() {
        let options = ConnectionOptions::from_pairs(vec![
            ("host".into(), "localhost".into()),
            ("port".into(), String::new()),
            ("password".into(), "it's a \\ test".into()),
            ("options".into(), "-c search_path=x".into()),
        ])
        .unwrap();
        assert_eq!(
            options.config().get_password(),
            Some(&b"it's a \\ test"[..])
        );
        assert_eq!(options.config().get_options(), Some("-c search_path=x"));
    }
}
