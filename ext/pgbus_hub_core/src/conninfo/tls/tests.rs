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
