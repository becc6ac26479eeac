//! The TLS side of a connection, as libpq does it: the policy `sslmode`
//! selects, the server-certificate check (`sslrootcert`, `sslcrl`,
//! `sslcrldir`), the client certificate (`sslcert`, `sslkey`) and SNI
//! (`sslsni`). Files are read each time a connector is made, so a reconnect
//! picks up rotated certificates and CRLs as libpq would.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::{RootCertStore, SupportedProtocolVersion};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres_rustls::MakeRustlsConnect;

use tokio_postgres::config::{Host, SslNegotiation};
use tokio_postgres::Config;

use super::{config_error, ConfigError};

mod openssl_store;
mod verifier;
use verifier::PgVerifier;

/// libpq's default file names, under `~/.postgresql/`.
const DEFAULT_ROOT_CERT: &str = ".postgresql/root.crt";
const DEFAULT_ROOT_CRL: &str = ".postgresql/root.crl";
const DEFAULT_CLIENT_CERT: &str = ".postgresql/postgresql.crt";
const DEFAULT_CLIENT_KEY: &str = ".postgresql/postgresql.key";

/// The `sslrootcert` value naming the operating system's trust store.
pub(super) const SYSTEM_ROOTS: &str = "system";

/// `sslmode`, with libpq's meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPolicy {
    /// Never TLS.
    Disable,
    /// Plain first; TLS if the plain attempt fails.
    Allow,
    /// TLS first; plain if the TLS attempt fails (the default).
    Prefer,
    /// TLS only. The chain is checked only when a root certificate is
    /// there (`sslrootcert`, or `~/.postgresql/root.crt`), as libpq does.
    Require,
    /// TLS; the server certificate must chain to a root certificate.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the `host` connected to.
    VerifyFull,
}

impl TlsPolicy {
    pub(super) fn parse(value: &str) -> Result<Self, ConfigError> {
        Ok(match value {
            "disable" => Self::Disable,
            "allow" => Self::Allow,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(config_error(format!(
                    "invalid sslmode {other:?} (expected disable, allow, prefer, require, verify-ca or verify-full)"
                )))
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Allow => "allow",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    /// The modes that fail rather than skip the check when no root
    /// certificate is found.
    fn must_verify(self) -> bool {
        matches!(self, Self::VerifyCa | Self::VerifyFull)
    }

    /// The modes whose connection is always encrypted (libpq refuses
    /// `sslnegotiation=direct` and needs a host name for the others).
    pub(super) fn always_encrypts(self) -> bool {
        matches!(self, Self::Require | Self::VerifyCa | Self::VerifyFull)
    }
}

/// libpq's names for TLS versions, oldest first; the index orders them.
const TLS_VERSION_NAMES: [&str; 4] = ["TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"];
/// libpq's default `ssl_min_protocol_version`.
const DEFAULT_MIN_TLS_VERSION: &str = "TLSv1.2";

/// The versions `ssl_min_protocol_version`/`ssl_max_protocol_version` allow
/// (libpq's names, any case) that rustls speaks: TLS 1.2 and 1.3.
pub(super) fn protocol_versions(
    min: Option<&str>,
    max: Option<&str>,
) -> Result<Vec<&'static SupportedProtocolVersion>, ConfigError> {
    let rank = |keyword: &str, value: &str| {
        version_rank(value).ok_or_else(|| {
            config_error(format!(
                "invalid {keyword} {value:?} (expected one of {})",
                TLS_VERSION_NAMES.join(", ")
            ))
        })
    };
    let low = rank(
        "ssl_min_protocol_version",
        min.unwrap_or(DEFAULT_MIN_TLS_VERSION),
    )?;
    let high = match max {
        Some(value) => rank("ssl_max_protocol_version", value)?,
        None => TLS_VERSION_NAMES.len() - 1,
    };
    if low > high {
        return Err(config_error("invalid SSL protocol version range"));
    }
    let spoken = [
        ("TLSv1.2", &rustls::version::TLS12),
        ("TLSv1.3", &rustls::version::TLS13),
    ];
    let versions: Vec<_> = spoken
        .into_iter()
        .filter(|(name, _)| version_rank(name).is_some_and(|r| (low..=high).contains(&r)))
        .map(|(_, version)| version)
        .collect();
    if versions.is_empty() {
        return Err(config_error(
            "ssl_max_protocol_version below TLSv1.2 cannot be honoured: rustls speaks TLS 1.2 and 1.3 only",
        ));
    }
    Ok(versions)
}

fn version_rank(name: &str) -> Option<usize> {
    TLS_VERSION_NAMES
        .iter()
        .position(|known| known.eq_ignore_ascii_case(name))
}

/// The TLS keywords after libpq's defaults (keyword, else `PGSSL*`); the
/// `~/.postgresql/` fallbacks are looked up when a connector is made.
#[derive(Debug, Clone)]
pub(super) struct TlsSettings {
    pub policy: TlsPolicy,
    pub protocol_versions: Vec<&'static SupportedProtocolVersion>,
    /// False for `sslcertmode=disable`.
    pub send_client_cert: bool,
    pub rootcert: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    pub crl: Option<String>,
    pub crldir: Option<String>,
    pub sni: bool,
    pub home: Option<PathBuf>,
}

/// Type of a tokio-postgres connection opened by [`ConnectionOptions::connect`](super::ConnectionOptions::connect).
pub type PgConnection = tokio_postgres::Connection<
    super::socket::PgSocket,
    <MakeRustlsConnect as MakeTlsConnect<super::socket::PgSocket>>::Stream,
>;

impl TlsSettings {
    /// The rustls connector for these settings, reading the files they name.
    pub(super) fn connector(&self) -> Result<MakeRustlsConnect, ConfigError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = match self.policy {
            // No TLS will be attempted: read no file (libpq does not either).
            TlsPolicy::Disable => None,
            _ => self.chain_verifier(&provider)?,
        };
        let verifier = Arc::new(PgVerifier {
            chain,
            check_name: self.policy == TlsPolicy::VerifyFull,
            provider: provider.clone(),
        });
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&self.protocol_versions)
            .map_err(|e| config_error(format!("TLS set-up failed: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let identity = match self.policy {
            TlsPolicy::Disable => None,
            _ if !self.send_client_cert => None,
            _ => self.client_identity()?,
        };
        let mut config = match identity {
            Some((certs, key)) => builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| config_error(format!("sslcert/sslkey cannot be used: {e}")))?,
            None => builder.with_no_client_auth(),
        };
        // rustls, like libpq, never sends SNI for an IP address.
        config.enable_sni = self.sni;
        Ok(MakeRustlsConnect::new(config))
    }

    fn home_file(&self, relative: &str) -> Option<PathBuf> {
        self.home.as_ref().map(|home| home.join(relative))
    }

    /// The chain check, or None where libpq checks nothing (a mode below
    /// verify-ca with no root certificate).
    fn chain_verifier(
        &self,
        provider: &Arc<CryptoProvider>,
    ) -> Result<Option<Arc<WebPkiServerVerifier>>, ConfigError> {
        let roots = match self.rootcert.as_deref() {
            Some(SYSTEM_ROOTS) => system_roots()?,
            // Stricter than libpq, which silently skips the check when a
            // named file is missing: a named root certificate is meant to be used.
            Some(path) => pem_roots(Path::new(path))?,
            None => match self.home_file(DEFAULT_ROOT_CERT) {
                Some(path) if path.exists() => pem_roots(&path)?,
                Some(path) if self.policy.must_verify() => {
                    return Err(config_error(format!(
                        "sslmode={}: root certificate file \"{}\" does not exist; provide it, \
                         name one with sslrootcert, use the system's trusted roots with \
                         sslrootcert=system, or choose an sslmode that does not verify the server",
                        self.policy.name(),
                        path.display()
                    )))
                }
                None if self.policy.must_verify() => {
                    return Err(config_error(format!(
                        "sslmode={}: no home directory to find ~/{DEFAULT_ROOT_CERT} in; name the root certificate with sslrootcert",
                        self.policy.name()
                    )))
                }
                _ => return Ok(None),
            },
        };
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .with_crls(self.crls()?)
                .build()
                .map_err(|e| {
                    config_error(format!("server certificate check cannot be set up: {e}"))
                })?;
        Ok(Some(verifier))
    }

    /// `sslcrl` and `sslcrldir`, else `~/.postgresql/root.crl` if present.
    /// As with libpq's OpenSSL, once CRLs are loaded every certificate of the
    /// chain must have its issuer's CRL.
    fn crls(&self) -> Result<Vec<CertificateRevocationListDer<'static>>, ConfigError> {
        let mut files = Vec::new();
        if let Some(crl) = &self.crl {
            files.push(PathBuf::from(crl));
        }
        if let Some(dir) = &self.crldir {
            let entries = std::fs::read_dir(dir)
                .map_err(|e| config_error(format!("sslcrldir \"{dir}\" cannot be read: {e}")))?;
            for entry in entries {
                let path = entry
                    .map_err(|e| config_error(format!("sslcrldir \"{dir}\" cannot be read: {e}")))?
                    .path();
                if path.is_file() {
                    files.push(path);
                }
            }
        }
        if self.crl.is_none() && self.crldir.is_none() {
            files.extend(
                self.home_file(DEFAULT_ROOT_CRL)
                    .filter(|path| path.exists()),
            );
        }
        let mut crls = Vec::new();
        for path in files {
            let pem = read_file("sslcrl", &path)?;
            for crl in CertificateRevocationListDer::pem_slice_iter(&pem) {
                crls.push(crl.map_err(|e| pem_error("sslcrl", &path, e))?);
            }
        }
        // A CRL named but empty of CRLs would silently check nothing.
        if crls.is_empty() && (self.crl.is_some() || self.crldir.is_some()) {
            return Err(config_error(
                "sslcrl/sslcrldir name no PEM certificate revocation list",
            ));
        }
        Ok(crls)
    }

    /// `sslcert` + `sslkey` (defaults `~/.postgresql/postgresql.crt`/`.key`).
    /// As in libpq, a certificate file that does not exist means "no client
    /// certificate" (the server decides whether that is enough).
    #[allow(clippy::type_complexity)]
    fn client_identity(
        &self,
    ) -> Result<Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>, ConfigError> {
        let cert_path = match &self.cert {
            Some(path) => PathBuf::from(path),
            None => match self.home_file(DEFAULT_CLIENT_CERT) {
                Some(path) => path,
                None => return Ok(None),
            },
        };
        if !cert_path.exists() {
            if self.cert.is_some() {
                log::warn!(
                    "sslcert \"{}\" does not exist: connecting without a client certificate (as libpq does)",
                    cert_path.display()
                );
            }
            return Ok(None);
        }
        let pem = read_file("sslcert", &cert_path)?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_error("sslcert", &cert_path, e))?;
        if certs.is_empty() {
            return Err(config_error(format!(
                "sslcert \"{}\" holds no PEM certificate",
                cert_path.display()
            )));
        }
        let key_path = match (&self.key, self.home_file(DEFAULT_CLIENT_KEY)) {
            (Some(path), _) => PathBuf::from(path),
            (None, Some(path)) => path,
            (None, None) => {
                return Err(config_error(
                    "sslcert is given but no sslkey, and there is no home directory for ~/.postgresql/postgresql.key",
                ))
            }
        };
        Ok(Some((certs, private_key(&key_path)?)))
    }
}

/// The client key, with libpq's checks: a plain file, not readable by group
/// or world (group-readable is allowed when root owns it), not encrypted
/// (`sslpassword` is not supported), not an OpenSSL engine reference.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, ConfigError> {
    let shown = path.display();
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(_) if path.to_string_lossy().contains(':') => {
            return Err(config_error(format!(
                "sslkey \"{shown}\" looks like an OpenSSL engine key (engine:key), which is not supported"
            )))
        }
        Err(e) => {
            return Err(config_error(format!(
                "certificate present, but not private key file \"{shown}\": {e}"
            )))
        }
    };
    if !metadata.is_file() {
        return Err(config_error(format!(
            "private key file \"{shown}\" is not a regular file"
        )));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let mode = metadata.mode();
    // libpq's rule, to the letter: only these two cases are refused.
    let group_or_world_access =
        (metadata.uid() == euid && mode & 0o077 != 0) || (metadata.uid() == 0 && mode & 0o037 != 0);
    if group_or_world_access {
        return Err(config_error(format!(
            "private key file \"{shown}\" has group or world access; file must have permissions \
             u=rw (0600) or less if owned by the current user, or u=rw,g=r (0640) or less if owned by root"
        )));
    }
    let pem = read_file("sslkey", path)?;
    let text = String::from_utf8_lossy(&pem);
    if text.contains("ENCRYPTED PRIVATE KEY") || text.contains("Proc-Type: 4,ENCRYPTED") {
        return Err(config_error(format!(
            "private key file \"{shown}\" is encrypted: sslpassword is not supported; \
             decrypt it (openssl pkey -in KEY -out PLAIN_KEY) and keep it mode 0600"
        )));
    }
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| pem_error("sslkey", path, e))
}

fn read_file(keyword: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| {
        config_error(format!(
            "{keyword} \"{}\" cannot be read: {e}",
            path.display()
        ))
    })
}

fn pem_error(keyword: &str, path: &Path, error: rustls::pki_types::pem::Error) -> ConfigError {
    config_error(format!(
        "{keyword} \"{}\" is not usable PEM: {error}",
        path.display()
    ))
}

fn pem_roots(path: &Path) -> Result<RootCertStore, ConfigError> {
    let pem = read_file("sslrootcert", path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error("sslrootcert", path, e))?;
    roots_from("sslrootcert", &path.display().to_string(), certs)
}

/// `sslrootcert=system`: the operating system's trust store.
fn system_roots() -> Result<RootCertStore, ConfigError> {
    let (certs, reasons) = system_certs();
    if certs.is_empty() {
        return Err(config_error(format!(
            "sslrootcert=system: no trusted root certificate found in the system store ({})",
            reasons.join("; ")
        )));
    }
    roots_from("sslrootcert", SYSTEM_ROOTS, certs)
}

/// The files OpenSSL would read (`SSL_CERT_FILE`/`SSL_CERT_DIR`, else the
/// distribution's bundle), through `rustls-native-certs`.
#[cfg(not(target_vendor = "apple"))]
fn system_certs() -> (Vec<CertificateDer<'static>>, Vec<String>) {
    let loaded = rustls_native_certs::load_native_certs();
    let reasons = loaded.errors.iter().map(|e| e.to_string()).collect();
    (loaded.certs, reasons)
}

/// macOS: the files libpq's OpenSSL reads there, no framework (openssl_store.rs).
#[cfg(target_vendor = "apple")]
fn system_certs() -> (Vec<CertificateDer<'static>>, Vec<String>) {
    openssl_store::load(&openssl_store::env_trust_paths())
}

fn roots_from(
    keyword: &str,
    source: &str,
    certs: Vec<CertificateDer<'static>>,
) -> Result<RootCertStore, ConfigError> {
    let mut roots = RootCertStore::empty();
    let (added, _unparsable) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(config_error(format!(
            "{keyword} \"{source}\" holds no usable certificate"
        )));
    }
    Ok(roots)
}

/// The TLS keywords as given (else from their `PGSSL*` variables), until
/// [`TlsKeywords::settings`] applies libpq's rules to them.
#[derive(Default)]
pub(super) struct TlsKeywords {
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
}

impl TlsKeywords {
    /// True if `key` is a TLS keyword (then kept).
    pub(super) fn take(&mut self, key: &str, value: &str) -> bool {
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
            _ => return false,
        };
        *slot = Some(value.to_string());
        true
    }

    /// The TLS keywords, else their `PGSSL*` variables, with libpq's rules.
    pub(super) fn settings(
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
        let protocol_versions = protocol_versions(
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

#[cfg(test)]
mod tests;
