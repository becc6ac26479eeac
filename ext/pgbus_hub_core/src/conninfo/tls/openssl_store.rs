//! `sslrootcert=system` on macOS: the trust store as libpq built with OpenSSL
//! reads it there (`SSL_CTX_set_default_verify_paths`), from files only, so
//! the extension links no Apple framework (`rustls-native-certs` asks the
//! Security framework instead). `SSL_CERT_FILE` and `SSL_CERT_DIR` (a
//! `:`-separated list) when either is set, as on Linux; else
//! `/etc/ssl/cert.pem`, the bundle macOS ships. Built on every target so its
//! tests run on Linux; only Apple targets call it.
#![cfg_attr(not(target_vendor = "apple"), allow(dead_code))]

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// The bundle macOS ships (LibreSSL's default file there).
pub(super) const MACOS_CERT_FILE: &str = "/etc/ssl/cert.pem";

/// What to read, in order: a PEM file, then every file of each directory.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct TrustPaths {
    pub file: Option<PathBuf>,
    pub dirs: Vec<PathBuf>,
}

/// The paths for the values of `SSL_CERT_FILE` and `SSL_CERT_DIR` (empty
/// counts as unset): those given, else [`MACOS_CERT_FILE`].
pub(super) fn trust_paths(cert_file: Option<OsString>, cert_dir: Option<OsString>) -> TrustPaths {
    let file = cert_file.filter(|f| !f.is_empty()).map(PathBuf::from);
    let dirs: Vec<PathBuf> = cert_dir
        .map(|dirs| {
            std::env::split_paths(&dirs)
                .filter(|dir| !dir.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    if file.is_none() && dirs.is_empty() {
        return TrustPaths {
            file: Some(PathBuf::from(MACOS_CERT_FILE)),
            dirs,
        };
    }
    TrustPaths { file, dirs }
}

/// The process environment's paths.
pub(super) fn env_trust_paths() -> TrustPaths {
    trust_paths(
        std::env::var_os("SSL_CERT_FILE"),
        std::env::var_os("SSL_CERT_DIR"),
    )
}

/// Every certificate those paths hold, and what could not be read (one
/// sentence each); a file that is no PEM certificate in a directory is skipped.
pub(super) fn load(paths: &TrustPaths) -> (Vec<CertificateDer<'static>>, Vec<String>) {
    let mut certs = Vec::new();
    let mut errors = Vec::new();
    if let Some(file) = &paths.file {
        pem_certs(file, &mut certs, &mut errors);
    }
    for dir in &paths.dirs {
        match std::fs::read_dir(dir) {
            Ok(entries) => {
                let mut files: Vec<PathBuf> = entries
                    .filter_map(|entry| entry.ok().map(|e| e.path()))
                    .filter(|path| path.is_file())
                    .collect();
                files.sort();
                for path in files {
                    pem_certs(&path, &mut certs, &mut errors);
                }
            }
            Err(e) => errors.push(format!("{}: {e}", dir.display())),
        }
    }
    certs.sort_unstable_by(|a, b| a.as_ref().cmp(b.as_ref()));
    certs.dedup();
    (certs, errors)
}

fn pem_certs(path: &Path, certs: &mut Vec<CertificateDer<'static>>, errors: &mut Vec<String>) {
    match CertificateDer::pem_file_iter(path) {
        Ok(iter) => {
            for cert in iter {
                match cert {
                    Ok(cert) => certs.push(cert),
                    Err(e) => errors.push(format!("{}: {e}", path.display())),
                }
            }
        }
        Err(e) => errors.push(format!("{}: {e}", path.display())),
    }
}
