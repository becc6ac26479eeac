use super::defaults::default_socket_dir;
use super::*;
use std::path::Path;
use tokio_postgres::config::Host;

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
    let url = ConnectionOptions::parse("postgres://u@localhost/db?application_name=mine").unwrap();
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
