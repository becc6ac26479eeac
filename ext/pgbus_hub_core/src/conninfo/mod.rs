//! libpq-style connection options (URL, keyword string, keyword pairs) turned
//! into a tokio-postgres [`Config`] plus TLS settings: parsing and libpq's
//! defaults here; TLS in [`tls`], the password file in [`pgpass`], service
//! files in [`service`], opening a connection in [`connect`], SQL quoting in
//! [`quote`].

mod connect;
mod pgpass;
mod quote;
mod service;
mod tls;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use tokio_postgres::config::{Host, SslNegotiation};
use tokio_postgres::Config;

pub use connect::{describe, ConnectError, Connected, ServerMessage, DEFAULT_CONNECT_TIMEOUT};
pub use quote::{quote_ident, quote_literal, QuoteError};
pub use tls::{PgConnection, TlsPolicy};
use tls::{TlsSettings, SYSTEM_ROOTS};

/// The census tag operators count in `pg_stat_activity` (pgbus's `APP_NAME`),
/// used unless the options name an `application_name` themselves.
pub const DEFAULT_APPLICATION_NAME: &str = "pgbus-listen";

/// Debian's libpq default socket directory; elsewhere libpq uses /tmp.
const DEBIAN_SOCKET_DIR: &str = "/var/run/postgresql";

/// Debian's libpq `sysconfdir` (`pg_config --sysconfdir`), where the
/// system-wide `pg_service.conf` is sought unless `PGSYSCONFDIR` names another.
const DEBIAN_SYSCONFDIR: &str = "/etc/postgresql-common";

/// libpq's port when none is given (tokio-postgres uses the same).
const DEFAULT_PORT: u16 = 5432;

/// libpq's per-user files, relative to the home directory.
const USER_PASSFILE: &str = ".pgpass";
const USER_SERVICEFILE: &str = ".pg_service.conf";

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

const GSSAPI_UNSUPPORTED: &str =
    "GSSAPI/Kerberos authentication is not supported (tokio-postgres has no GSSAPI)";
const OAUTH_UNSUPPORTED: &str = "OAuth authentication is not supported (tokio-postgres has none)";

/// libpq keywords this client cannot honour, each with the reason; refused
/// by name rather than silently ignored (ignoring one could weaken security
/// or connect somewhere else than libpq would).
const UNSUPPORTED_KEYWORDS: &[(&str, &str)] = &[
    (
        "sslpassword",
        "encrypted client keys are not supported; decrypt the key (openssl pkey) and leave sslpassword out",
    ),
    ("sslkeylogfile", "writing TLS session keys to a file is not supported"),
    ("requiressl", "deprecated in libpq; use sslmode=require"),
    ("gsslib", GSSAPI_UNSUPPORTED),
    ("gssdelegation", GSSAPI_UNSUPPORTED),
    ("krbsrvname", GSSAPI_UNSUPPORTED),
    (
        "requirepeer",
        "checking the server process's user over a Unix socket is not implemented",
    ),
    (
        "require_auth",
        "tokio-postgres cannot restrict the server's authentication methods",
    ),
    (
        "replication",
        "the hub needs an ordinary session (LISTEN), not a replication connection",
    ),
    ("min_protocol_version", "tokio-postgres speaks protocol 3.0 only"),
    ("max_protocol_version", "tokio-postgres speaks protocol 3.0 only"),
    ("oauth_issuer", OAUTH_UNSUPPORTED),
    ("oauth_client_id", OAUTH_UNSUPPORTED),
    ("oauth_client_secret", OAUTH_UNSUPPORTED),
    ("oauth_scope", OAUTH_UNSUPPORTED),
];

/// libpq's environment variables, each the default of one keyword: used
/// when neither the options nor the service set it, through the same checks
/// (so one naming an unsupported feature is refused, not ignored).
/// `PGSERVICE`/`PGSERVICEFILE` are read before, to find the service.
const ENV_DEFAULTS: &[(&str, &str)] = &[
    ("host", "PGHOST"),
    ("hostaddr", "PGHOSTADDR"),
    ("port", "PGPORT"),
    ("dbname", "PGDATABASE"),
    ("user", "PGUSER"),
    ("password", "PGPASSWORD"),
    ("passfile", "PGPASSFILE"),
    ("channel_binding", "PGCHANNELBINDING"),
    ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ("options", "PGOPTIONS"),
    ("application_name", "PGAPPNAME"),
    ("client_encoding", "PGCLIENTENCODING"),
    ("sslmode", "PGSSLMODE"),
    ("sslnegotiation", "PGSSLNEGOTIATION"),
    ("sslcompression", "PGSSLCOMPRESSION"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
    ("sslcertmode", "PGSSLCERTMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcrl", "PGSSLCRL"),
    ("sslcrldir", "PGSSLCRLDIR"),
    ("sslsni", "PGSSLSNI"),
    ("requirepeer", "PGREQUIREPEER"),
    ("require_auth", "PGREQUIREAUTH"),
    ("ssl_min_protocol_version", "PGSSLMINPROTOCOLVERSION"),
    ("ssl_max_protocol_version", "PGSSLMAXPROTOCOLVERSION"),
    ("gssencmode", "PGGSSENCMODE"),
    ("krbsrvname", "PGKRBSRVNAME"),
    ("gsslib", "PGGSSLIB"),
    ("gssdelegation", "PGGSSDELEGATION"),
    ("target_session_attrs", "PGTARGETSESSIONATTRS"),
    ("load_balance_hosts", "PGLOADBALANCEHOSTS"),
    ("min_protocol_version", "PGMINPROTOCOLVERSION"),
    ("max_protocol_version", "PGMAXPROTOCOLVERSION"),
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
    tls: TlsSettings,
    variables: Vec<(String, String)>,
    /// `gssencmode` as given (disable or prefer): shown in the debug log line,
    /// since it changes nothing here.
    gssencmode: Option<String>,
    /// Why the password file was ignored (libpq's warning), added to connect
    /// errors: the warning alone may go to no log.
    passfile_ignored: Option<String>,
}

impl ConnectionOptions {
    /// A libpq URL (`postgres://` / `postgresql://`, query parameters such as
    /// `sslmode`, `application_name`, `host=/socket/dir`) or a libpq keyword
    /// string (`host=... dbname=...`, values optionally `'quoted'`).
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let trimmed = s.trim();
        if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
            Self::from_pairs(url_pairs(trimmed)?)
        } else {
            Self::from_pairs(parse_keywords(trimmed)?)
        }
    }

    /// libpq keyword/value pairs (a Ruby Hash, stringified). Empty values are
    /// ignored, as libpq does. Unknown keywords are refused by name. What the
    /// pairs leave out comes, in libpq's order, from the `service` (or
    /// `PGSERVICE`), the environment (`ENV_DEFAULTS`), the password file,
    /// then the compiled-in defaults.
    pub fn from_pairs(pairs: Vec<(String, String)>) -> Result<Self, ConfigError> {
        let given: Vec<(String, String)> =
            pairs.into_iter().filter(|(_, v)| !v.is_empty()).collect();
        let from_service = service_pairs(&given)?;
        let mut passthrough = String::new();
        let mut intercepted = Intercepted::default();
        let mut add = |key: &str, value: &str| -> Result<(), ConfigError> {
            if !intercepted.take(key, value)? {
                check_keyword(key)?;
                passthrough.push_str(key);
                passthrough.push_str("='");
                passthrough.push_str(&value.replace('\\', "\\\\").replace('\'', "\\'"));
                passthrough.push_str("' ");
            }
            Ok(())
        };
        for (key, value) in &given {
            add(key, value)?;
        }
        let mut set: Vec<String> = given.iter().map(|(key, _)| key.clone()).collect();
        if let Some((origin, pairs)) = from_service {
            for (key, value) in pairs {
                add(&key, &value).map_err(|e| config_error(format!("{} ({origin})", e.0)))?;
                set.push(key);
            }
        }
        for (key, env) in ENV_DEFAULTS {
            if set.iter().any(|given| given == key) {
                continue;
            }
            if let Some(value) = env_nonempty(env) {
                add(key, &value).map_err(|e| config_error(format!("{} (from {env})", e.0)))?;
            }
        }
        let config = Config::from_str(&passthrough).map_err(|e| config_error(e.to_string()))?;
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

    /// The server(s) and database these options reach, libpq's defaults
    /// applied (`host=... port=... dbname=...`): equal for two
    /// configurations of the same database, however each was written.
    pub fn database(&self) -> String {
        let config = &self.config;
        let hosts: Vec<String> = config.get_hosts().iter().map(host_text).collect();
        let hostaddrs: Vec<String> = config
            .get_hostaddrs()
            .iter()
            .map(|a| a.to_string())
            .collect();
        let mut ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
        if ports.is_empty() {
            ports.push(DEFAULT_PORT.to_string());
        }
        let user = config.get_user().unwrap_or_default();
        format!(
            "host={} hostaddr={} port={} dbname={}",
            hosts.join(","),
            hostaddrs.join(","),
            ports.join(","),
            config.get_dbname().unwrap_or(user)
        )
    }

    pub fn tls_policy(&self) -> TlsPolicy {
        self.tls.policy
    }

    /// The underlying tokio-postgres configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }
}

/// A URL as keyword pairs, so that it goes through the same checks, service
/// lookup and defaults as a keyword string. tokio-postgres reads the part
/// before `?` (user, password, hosts, ports, database); what it found there
/// is what the URL gave.
fn url_pairs(url: &str) -> Result<Vec<(String, String)>, ConfigError> {
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

fn host_text(host: &Host) -> String {
    match host {
        Host::Tcp(name) => name.clone(),
        Host::Unix(path) => path.display().to_string(),
    }
}

/// The pairs of the `service` named in `given` (else `PGSERVICE`) that
/// `given` does not set itself, and where they came from; None without a service.
#[allow(clippy::type_complexity)]
fn service_pairs(
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
    let (pairs, file) = service::lookup(&name, &files)?;
    let origin = format!("from service \"{name}\" in \"{}\"", file.display());
    let unset = pairs
        .into_iter()
        .filter(|(key, value)| !value.is_empty() && !given.iter().any(|(g, _)| g == key))
        .collect();
    Ok(Some((origin, unset)))
}

/// Keywords this module handles itself instead of tokio-postgres.
#[derive(Default)]
struct Intercepted {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    sslcert: Option<String>,
    sslkey: Option<String>,
    sslcrl: Option<String>,
    sslcrldir: Option<String>,
    sslsni: Option<String>,
    sslcertmode: Option<String>,
    ssl_min_protocol_version: Option<String>,
    ssl_max_protocol_version: Option<String>,
    passfile: Option<String>,
    gssencmode: Option<String>,
    application_name: Option<String>,
    fallback_application_name: Option<String>,
}

impl Intercepted {
    /// True if `key` was one of ours.
    fn take(&mut self, key: &str, value: &str) -> Result<bool, ConfigError> {
        let slot = match key {
            "sslmode" => &mut self.sslmode,
            "sslrootcert" => &mut self.sslrootcert,
            "sslcert" => &mut self.sslcert,
            "sslkey" => &mut self.sslkey,
            "sslcrl" => &mut self.sslcrl,
            "sslcrldir" => &mut self.sslcrldir,
            "sslsni" => &mut self.sslsni,
            "sslcertmode" => &mut self.sslcertmode,
            "ssl_min_protocol_version" => &mut self.ssl_min_protocol_version,
            "ssl_max_protocol_version" => &mut self.ssl_max_protocol_version,
            "passfile" => &mut self.passfile,
            "application_name" => &mut self.application_name,
            "fallback_application_name" => &mut self.fallback_application_name,
            "gssencmode" => {
                self.gssencmode = Some(parse_gssencmode(value)?);
                return Ok(true);
            }
            // Already used to find the service's pairs.
            "service" | "servicefile" => return Ok(true),
            "sslcompression" => {
                // Compression is never used, so only "off" can be honoured.
                if value != "0" {
                    return Err(config_error(
                        "sslcompression=1 is not supported: TLS compression is never used (obsolete)",
                    ));
                }
                return Ok(true);
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
                return Ok(true);
            }
            "variables" => {
                return Err(config_error(
                    "`variables` is not a connection keyword; pass it separately",
                ))
            }
            _ => return Ok(false),
        };
        *slot = Some(value.to_string());
        Ok(true)
    }

    fn finish(self, mut config: Config) -> Result<ConnectionOptions, ConfigError> {
        apply_compiled_defaults(&mut config)?;
        let home = home_dir();
        // libpq reads the password file only when no password was given
        // (PGPASSWORD counts as given).
        let mut passfile_ignored = None;
        if config.get_password().is_none() {
            let passfile = self
                .passfile
                .clone()
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|home| home.join(USER_PASSFILE)));
            if let Some(path) = passfile {
                match pgpass::read(&path) {
                    Ok(Some(text)) => {
                        if let Some(password) = password_for_hosts(&config, &text, &path)? {
                            config.password(password);
                        }
                    }
                    Ok(None) => {}
                    Err(reason) => passfile_ignored = Some(reason),
                }
            }
        }
        let application_name = self
            .application_name
            .clone()
            .or(self.fallback_application_name.clone())
            .unwrap_or_else(|| DEFAULT_APPLICATION_NAME.to_string());
        config.application_name(&application_name);
        let tls = self.tls_settings(&config, home)?;
        // Read the files now too, so that a bad path or key fails at boot.
        tls.connector()?;
        Ok(ConnectionOptions {
            config,
            tls,
            variables: Vec::new(),
            gssencmode: self.gssencmode,
            passfile_ignored,
        })
    }

    /// The TLS keywords, else their `PGSSL*` variables, with libpq's rules.
    fn tls_settings(
        &self,
        config: &Config,
        home: Option<PathBuf>,
    ) -> Result<TlsSettings, ConfigError> {
        let rootcert = self.sslrootcert.clone();
        let system_roots = rootcert.as_deref() == Some(SYSTEM_ROOTS);
        let mut policy = match &self.sslmode {
            Some(mode) => TlsPolicy::parse(mode)?,
            // libpq: sslrootcert=system makes verify-full the default.
            None if system_roots => TlsPolicy::VerifyFull,
            None => TlsPolicy::Prefer,
        };
        if system_roots && policy != TlsPolicy::VerifyFull {
            return Err(config_error(format!(
                "weak sslmode \"{}\" may not be used with sslrootcert=system (use \"verify-full\")",
                policy.name()
            )));
        }
        if config.get_ssl_negotiation() == SslNegotiation::Direct && !policy.always_encrypts() {
            return Err(config_error(format!(
                "weak sslmode \"{}\" may not be used with sslnegotiation=direct (use \"require\", \"verify-ca\", or \"verify-full\")",
                policy.name()
            )));
        }
        // libpq never uses TLS over a Unix socket (the kernel is the transport).
        let all_unix = !config.get_hosts().is_empty()
            && config.get_hostaddrs().is_empty()
            && config
                .get_hosts()
                .iter()
                .all(|host| matches!(host, Host::Unix(_)));
        if all_unix {
            policy = TlsPolicy::Disable;
        }
        if policy.always_encrypts() && config.get_hosts().is_empty() {
            return Err(config_error(format!(
                "sslmode={} needs `host` as well as `hostaddr`: the TLS handshake (and verify-full's name check) uses the host name",
                policy.name()
            )));
        }
        let sni = match self.sslsni.as_deref() {
            None | Some("1") => true,
            Some("0") => false,
            Some(other) => {
                return Err(config_error(format!(
                    "invalid sslsni {other:?} (expected 0 or 1)"
                )))
            }
        };
        let send_client_cert = match self.sslcertmode.as_deref() {
            None | Some("allow") => true,
            Some("disable") => false,
            Some("require") => {
                return Err(config_error(
                    "sslcertmode=require is not supported: pgbus-hub cannot tell whether the \
                     server asked for the certificate (allow, the default, sends it when asked)",
                ))
            }
            Some(other) => {
                return Err(config_error(format!(
                    "invalid sslcertmode {other:?} (expected allow, disable or require)"
                )))
            }
        };
        let protocol_versions = tls::protocol_versions(
            self.ssl_min_protocol_version.as_deref(),
            self.ssl_max_protocol_version.as_deref(),
        )?;
        Ok(TlsSettings {
            policy,
            protocol_versions,
            send_client_cert,
            rootcert,
            cert: self.sslcert.clone(),
            key: self.sslkey.clone(),
            crl: self.sslcrl.clone(),
            crldir: self.sslcrldir.clone(),
            sni,
            home,
        })
    }
}

/// The password file's password for this connection, or None. libpq looks
/// it up per host; tokio-postgres sends one password to every host, so
/// hosts the file gives different passwords (or a password for some only)
/// are refused rather than one host's password sent to another.
fn password_for_hosts(
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
            let target = pgpass::PassTarget {
                host,
                port: port.to_string(),
                dbname: dbname.to_string(),
                user: user.to_string(),
            };
            pgpass::find_password(text, &target)
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

fn check_keyword(key: &str) -> Result<(), ConfigError> {
    if PASSTHROUGH_KEYWORDS.contains(&key) {
        return Ok(());
    }
    match UNSUPPORTED_KEYWORDS.iter().find(|(name, _)| *name == key) {
        Some((_, reason)) => Err(config_error(format!(
            "connection option `{key}` is not supported by pgbus-hub: {reason}"
        ))),
        None => Err(config_error(format!("unknown connection option `{key}`"))),
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

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// libpq's compiled-in defaults, for what neither the options, the service
/// nor the environment gave: the socket directory and the OS user.
fn apply_compiled_defaults(config: &mut Config) -> Result<(), ConfigError> {
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
fn default_socket_dir() -> &'static str {
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
fn home_dir() -> Option<PathBuf> {
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
        let hosts: Vec<String> = self.config.get_hosts().iter().map(host_text).collect();
        let hostaddrs: Vec<String> = self
            .config
            .get_hostaddrs()
            .iter()
            .map(|a| a.to_string())
            .collect();
        match (hosts.is_empty(), hostaddrs.is_empty()) {
            (false, false) => write!(
                f,
                "host={} hostaddr={}",
                hosts.join(","),
                hostaddrs.join(",")
            )?,
            (true, _) => write!(f, "hostaddr={}", hostaddrs.join(","))?,
            (false, true) => write!(f, "host={}", hosts.join(","))?,
        }
        let ports: Vec<String> = self.config.get_ports().iter().map(u16::to_string).collect();
        write!(
            f,
            " port={}",
            if ports.is_empty() {
                DEFAULT_PORT.to_string()
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
        write!(f, " sslmode={}", self.tls.policy.name())?;
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
    fn database_is_the_same_however_the_options_are_written() {
        let url =
            ConnectionOptions::parse("postgres://alice:secret@db.example:5433/app?sslmode=disable")
                .unwrap();
        let keywords =
            ConnectionOptions::parse("host=db.example port=5433 dbname=app user=bob").unwrap();
        let pairs = ConnectionOptions::from_pairs(vec![
            ("host".into(), "db.example".into()),
            ("port".into(), "5433".into()),
            ("dbname".into(), "app".into()),
        ])
        .unwrap();
        assert_eq!(
            url.database(),
            "host=db.example hostaddr= port=5433 dbname=app"
        );
        assert_eq!(keywords.database(), url.database());
        assert_eq!(pairs.database(), url.database());
        let other = ConnectionOptions::parse("host=db.example port=5433 dbname=other").unwrap();
        assert_ne!(other.database(), url.database());
    }

    fn error(text: &str) -> String {
        ConnectionOptions::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn parse_errors_never_echo_what_may_be_a_secret() {
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
    fn tls_keyword_rules_and_unsupported_keywords_are_clear_errors() {
        let missing = error("host=h sslmode=verify-full sslrootcert=/nonexistent/root.crt");
        assert!(
            missing.contains("sslrootcert \"/nonexistent/root.crt\" cannot be read"),
            "{missing}"
        );
        for weak in ["require", "verify-ca", "disable"] {
            let text = format!("host=h sslrootcert=system sslmode={weak}");
            assert!(
                error(&text).contains(&format!(
                    "weak sslmode \"{weak}\" may not be used with sslrootcert=system"
                )),
                "{text}"
            );
        }
        assert!(error("host=h sslmode=prefer sslnegotiation=direct").contains("weak sslmode"));
        assert!(error("hostaddr=127.0.0.1 sslmode=require").contains("needs `host`"));
        assert!(error("host=h sslsni=yes").contains("invalid sslsni"));
        assert!(error("host=h sslmode=sometimes").contains("invalid sslmode"));
        let refused = error("postgres://h/db?sslpassword=x");
        assert!(
            refused.contains("`sslpassword` is not supported by pgbus-hub: encrypted client keys"),
            "{refused}"
        );
        assert!(!refused.contains("=x"), "{refused}");
        let err = ConnectionOptions::from_pairs(vec![("bogus".into(), "1".into())]).unwrap_err();
        assert!(
            err.to_string()
                .contains("unknown connection option `bogus`"),
            "{err}"
        );
        assert!(ConnectionOptions::parse("host=h port=notaport").is_err());
        assert!(ConnectionOptions::parse("host='unterminated").is_err());
        // Every mode parses; over a Unix socket TLS is never used.
        for mode in ["disable", "allow", "prefer", "require"] {
            let options = ConnectionOptions::parse(&format!("host=h sslmode={mode}")).unwrap();
            assert_eq!(options.tls_policy().name(), mode);
            assert!(options.to_string().contains(&format!("sslmode={mode}")));
        }
        let socket = ConnectionOptions::parse("host=/tmp sslmode=verify-full").unwrap();
        assert_eq!(socket.tls_policy(), TlsPolicy::Disable);
    }

    fn private_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pgbus-hub-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write_with_mode(path: &Path, text: &str, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn passfile_fills_a_missing_password_only_when_private() {
        let dir = private_dir("passfile");
        let private = dir.join("private");
        let open = dir.join("open");
        // A doubled backslash in the file is one backslash in the password.
        let line = "db.example:5433:app:alice:from\\\\file\n";
        write_with_mode(&private, line, 0o600);
        write_with_mode(&open, line, 0o644);
        let password = |text: String| {
            ConnectionOptions::parse(&text)
                .unwrap()
                .config()
                .get_password()
                .map(|p| String::from_utf8(p.to_vec()).unwrap())
        };
        let base = "host=db.example port=5433 dbname=app user=alice";
        assert_eq!(
            password(format!("{base} passfile={}", private.display())).as_deref(),
            Some("from\\file")
        );
        assert_eq!(
            password(format!("{base} passfile={}", open.display())),
            None
        );
        assert_eq!(
            password(format!(
                "{base} password=given passfile={}",
                private.display()
            ))
            .as_deref(),
            Some("given")
        );
        assert_eq!(
            password(format!(
                "host=other port=5433 dbname=app user=alice passfile={}",
                private.display()
            )),
            None
        );
        // One password is sent to every host: hosts the file treats differently are refused.
        let two_hosts = format!(
            "host=db.example,other port=5433 dbname=app user=alice passfile={}",
            private.display()
        );
        assert!(error(&two_hosts).contains("gives this connection's hosts different passwords"));
        // The default socket directory matches as `localhost`.
        write_with_mode(&private, "localhost:5432:app:alice:socket\n", 0o600);
        assert_eq!(
            password(format!(
                "host={} dbname=app user=alice passfile={}",
                default_socket_dir(),
                private.display()
            ))
            .as_deref(),
            Some("socket")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn service_fills_what_the_options_leave_out() {
        let dir = private_dir("service");
        let file = dir.join("services.conf");
        write_with_mode(
            &file,
            "[app]\nhost=db.example\nport=5433\ndbname=app\nsslmode=require\n[bad]\nbogus=1\n",
            0o644,
        );
        let options = ConnectionOptions::parse(&format!(
            "service=app servicefile={} dbname=explicit user=u",
            file.display()
        ))
        .unwrap();
        assert_eq!(options.config().get_ports(), &[5433]);
        assert_eq!(options.config().get_dbname(), Some("explicit"));
        assert_eq!(options.tls_policy(), TlsPolicy::Require);
        assert!(matches!(&options.config().get_hosts()[0], Host::Tcp(h) if h == "db.example"));
        let url = ConnectionOptions::parse(&format!(
            "postgres://u@other:6000/db?service=app&servicefile={}",
            file.display()
        ))
        .unwrap();
        assert_eq!(url.config().get_ports(), &[6000]);
        for (service, expected) in [
            (
                "bad",
                "unknown connection option `bogus` (from service \"bad\"",
            ),
            ("nope", "definition of service \"nope\" not found"),
        ] {
            let text = format!("service={service} servicefile={}", file.display());
            let shown = error(&text);
            assert!(shown.contains(expected), "{shown}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
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
