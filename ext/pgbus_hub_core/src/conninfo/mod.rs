//! libpq-style connection options (URL, keyword string, keyword pairs) turned
//! into a tokio-postgres [`Config`] plus TLS settings. Here: [`ConnectionOptions`],
//! which resolves them in libpq's order. The syntax of URLs and keyword
//! strings is in [`syntax`], which keywords mean what in [`keywords`],
//! libpq's defaults in [`defaults`], service files in [`service`], the
//! password file in [`pgpass`], TLS in [`tls`], opening a connection in
//! [`connect`], SQL quoting in [`quote`].

mod connect;
mod defaults;
mod keywords;
mod pgpass;
mod quote;
mod service;
mod socket;
mod syntax;
mod tls;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use tokio_postgres::Config;

pub use connect::{describe, ConnectError, Connected, ServerMessage, DEFAULT_CONNECT_TIMEOUT};
use defaults::{apply_compiled_defaults, env_nonempty, home_dir, DEFAULT_PORT, USER_PASSFILE};
use keywords::{check_keyword, parse_gssencmode, ENV_DEFAULTS};
pub use quote::{quote_ident, quote_literal, QuoteError};
use syntax::{host_text, parse_keywords, url_pairs};
pub use tls::{PgConnection, TlsPolicy};
use tls::{TlsKeywords, TlsSettings};

/// The census tag operators count in `pg_stat_activity` (pgbus's `APP_NAME`),
/// used unless the options name an `application_name` themselves.
pub const DEFAULT_APPLICATION_NAME: &str = "pgbus-listen";

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
        let from_service = service::pairs_for(&given)?;
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
        format!(
            "host={} hostaddr={} port={} dbname={}",
            hosts.join(","),
            hostaddrs.join(","),
            ports.join(","),
            self.dbname()
        )
    }

    /// The database name a connection goes to: `dbname`, or libpq's default, the user name.
    pub fn dbname(&self) -> &str {
        let config = &self.config;
        config
            .get_dbname()
            .unwrap_or(config.get_user().unwrap_or_default())
    }

    pub fn tls_policy(&self) -> TlsPolicy {
        self.tls.policy
    }

    /// The underlying tokio-postgres configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }
}

/// Keywords this module handles itself instead of tokio-postgres.
#[derive(Default)]
struct Intercepted {
    tls: TlsKeywords,
    passfile: Option<String>,
    gssencmode: Option<String>,
    application_name: Option<String>,
    fallback_application_name: Option<String>,
}

impl Intercepted {
    /// True if `key` was one of ours.
    fn take(&mut self, key: &str, value: &str) -> Result<bool, ConfigError> {
        if self.tls.take(key, value) {
            return Ok(true);
        }
        let slot = match key {
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
                        if let Some(password) = pgpass::password_for_hosts(&config, &text, &path)? {
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
        let tls = self.tls.settings(&config, home)?;
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
mod tests;
