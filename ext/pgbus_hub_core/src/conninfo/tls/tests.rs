use super::*;

#[test]
fn protocol_versions_follow_libpq_names_and_default_to_tls12_and_up() {
    let names = |min, max| {
        protocol_versions(min, max).map(|versions| {
            versions
                .iter()
                .map(|v| format!("{:?}", v.version))
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(names(None, None).unwrap(), ["TLSv1_2", "TLSv1_3"]);
    assert_eq!(names(Some("tlsv1"), None).unwrap(), ["TLSv1_2", "TLSv1_3"]);
    assert_eq!(names(Some("TLSv1.3"), None).unwrap(), ["TLSv1_3"]);
    assert_eq!(names(None, Some("TLSv1.2")).unwrap(), ["TLSv1_2"]);
    let error = |min, max| protocol_versions(min, max).unwrap_err().to_string();
    assert!(error(None, Some("TLSv1.1")).contains("invalid SSL protocol version range"));
    assert!(error(Some("TLSv1"), Some("TLSv1.1")).contains("rustls speaks TLS 1.2 and 1.3 only"));
    assert!(error(Some("SSLv3"), None).contains("invalid ssl_min_protocol_version"));
}

#[test]
fn the_macos_trust_store_is_ssl_cert_file_and_dir_else_etc_ssl_cert_pem() {
    use openssl_store::{trust_paths, TrustPaths, MACOS_CERT_FILE};
    let os = |s: &str| Some(std::ffi::OsString::from(s));
    let paths = |file: Option<&str>, dirs: &[&str]| TrustPaths {
        file: file.map(PathBuf::from),
        dirs: dirs.iter().map(PathBuf::from).collect(),
    };
    assert_eq!(trust_paths(None, None), paths(Some(MACOS_CERT_FILE), &[]));
    assert_eq!(
        trust_paths(os(""), os("")),
        paths(Some(MACOS_CERT_FILE), &[])
    );
    assert_eq!(trust_paths(os("/a.pem"), None), paths(Some("/a.pem"), &[]));
    assert_eq!(
        trust_paths(None, os("/d1:/d2")),
        paths(None, &["/d1", "/d2"])
    );
    assert_eq!(
        trust_paths(os("/a.pem"), os("/d1")),
        paths(Some("/a.pem"), &["/d1"])
    );
}

#[test]
fn the_macos_trust_store_reads_the_file_then_every_file_of_each_dir() {
    use openssl_store::{load, trust_paths};
    let dir = std::env::temp_dir().join(format!("pgbus-hub-store-{}", std::process::id()));
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let block =
        |b64: &str| format!("-----BEGIN CERTIFICATE-----\n{b64}\n-----END CERTIFICATE-----\n");
    std::fs::write(dir.join("bundle.pem"), block("AQEB") + &block("AgIC")).unwrap();
    std::fs::write(certs.join("a.0"), block("AgIC")).unwrap(); // also in the bundle: counted once
    std::fs::write(certs.join("b.0"), block("AwMD")).unwrap();
    std::fs::write(certs.join("README"), "not a certificate\n").unwrap();
    let ders = |certs: &[CertificateDer<'static>]| {
        certs
            .iter()
            .map(|c| c.as_ref().to_vec())
            .collect::<Vec<_>>()
    };
    let file = Some(dir.join("bundle.pem").into_os_string());
    let (found, errors) = load(&trust_paths(file.clone(), None));
    assert_eq!(ders(&found), [vec![1; 3], vec![2; 3]]);
    assert!(errors.is_empty(), "{errors:?}");
    let (found, errors) = load(&trust_paths(file, Some(certs.clone().into_os_string())));
    assert_eq!(ders(&found), [vec![1; 3], vec![2; 3], vec![3; 3]]);
    assert!(errors.is_empty(), "{errors:?}");
    let missing = dir.join("missing.pem").into_os_string();
    let (found, errors) = load(&trust_paths(Some(missing), None));
    assert!(found.is_empty());
    assert!(errors[0].contains("missing.pem"), "{errors:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
