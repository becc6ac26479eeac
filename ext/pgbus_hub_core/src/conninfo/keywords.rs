//! Which libpq keywords mean what here: those passed through to
//! tokio-postgres, those refused by name (each with its reason), the
//! environment variable behind each, and `gssencmode`'s accepted values.

use super::{config_error, ConfigError};

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
pub(super) const ENV_DEFAULTS: &[(&str, &str)] = &[
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

pub(super) fn check_keyword(key: &str) -> Result<(), ConfigError> {
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
pub(super) fn parse_gssencmode(value: &str) -> Result<String, ConfigError> {
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
