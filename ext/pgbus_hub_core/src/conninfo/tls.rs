//! The TLS side of a connection: the policy `sslmode` selects and the rustls connector.

use std::sync::Arc;

use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::Socket;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{config_error, ConfigError};

/// The TLS policy. `Require`/`Prefer` encrypt but do not authenticate the
/// server (libpq semantics); certificate verification is not offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPolicy {
    Disable,
    Prefer,
    Require,
}

/// TLS without certificate verification, for sslmode=require/prefer: libpq's
/// semantics for those modes are "encrypt, do not authenticate" (the server
/// commonly has a self-signed or snakeoil certificate). The handshake
/// signature is still checked against the presented key, so the session is
/// bound to that certificate; what is skipped is only chain + hostname validation.
pub(super) fn make_tls() -> Result<MakeRustlsConnect, ConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(EncryptOnly(provider.clone()));
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(format!("TLS set-up failed: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// Type of a tokio-postgres connection opened by [`ConnectionOptions::connect`].
pub type PgConnection =
    tokio_postgres::Connection<Socket, <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream>;

#[derive(Debug)]
struct EncryptOnly(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
