//! Connecting like libpq, against a real private PostgreSQL 15 with TLS (no
//! mocks): sslmode verify-full / verify-ca / require / allow / prefer,
//! sslrootcert, client certificates, sslcrl, the password file and the
//! service file. Each test has its own cluster, port and temp directory
//! (see `support_tls`). Every path is given by keyword (`sslrootcert=`,
//! `passfile=`, `servicefile=`...), so no test touches the environment and
//! tests can run in parallel. Without PostgreSQL's binaries, openssl or
//! runuser each test fails, unless PGBUS_HUB_SKIP_PG_TESTS=1 lets it say
//! "skipping" and pass (`support_pg::skip_or_fail`).

mod support_pg;
mod support_tls;

use std::path::Path;
use std::time::Duration;

use pgbus_hub_core::conninfo::ConnectionOptions;
use support_tls::{
    missing_tools, set_mode, PrivateCluster, CERT_ROLE, PASSWORD, PASSWORD_ROLE, PLAIN_ONLY_ROLE,
    TLS_TRUST_ROLE,
};

fn cluster() -> Option<PrivateCluster> {
    if let Some(why) = missing_tools() {
        return support_pg::skip_or_fail(false, &why);
    }
    Some(PrivateCluster::start())
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// What the session reports once connected: (current_user, TLS in use).
type Session = (String, bool);

/// Connect with `options` (a keyword string or URL) and read `expression`
/// (over this session's `pg_stat_ssl` row) as text, or the error text.
fn connect_and_read(options: &str, expression: &str) -> Result<String, String> {
    let options = ConnectionOptions::parse(options).map_err(|e| e.to_string())?;
    block_on(async {
        let connected = options.connect().await.map_err(|e| e.to_string())?;
        let sql =
            format!("SELECT ({expression})::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()");
        let row = connected
            .client
            .query_one(&sql, &[])
            .await
            .map_err(|e| e.to_string())?;
        connected.close(Duration::from_millis(100)).await;
        Ok(row.get(0))
    })
}

fn connect(options: &str) -> Result<Session, String> {
    let text = connect_and_read(options, "current_user || ' ' || ssl")?;
    let (user, ssl) = text.split_once(' ').expect("user and ssl");
    Ok((user.to_string(), ssl == "true"))
}

fn connect_ok(options: &str) -> Session {
    connect(options).unwrap_or_else(|e| panic!("{options}: {e}"))
}

fn connect_err(options: &str) -> String {
    match connect(options) {
        Ok(session) => panic!("{options}: connected as {session:?}, expected an error"),
        Err(error) => {
            println!("refused as expected: {error}");
            error
        }
    }
}

fn assert_contains(text: &str, wanted: &str) {
    assert!(text.contains(wanted), "expected {wanted:?} in: {text}");
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// Options for `role` on the cluster, verify-full against its CA.
fn verify_full_to_localhost(pg: &PrivateCluster, role: &str) -> String {
    format!(
        "host=localhost port={} user={role} dbname=postgres sslmode=verify-full sslrootcert={}",
        pg.port,
        path(&pg.certs.ca)
    )
}

#[test]
fn verify_full_connects_with_the_right_ca_to_localhost_and_its_ip() {
    let Some(pg) = cluster() else { return };
    let ca = path(&pg.certs.ca);
    for host in ["localhost", "127.0.0.1"] {
        let options = format!(
            "host={host} port={} user={TLS_TRUST_ROLE} dbname=postgres sslmode=verify-full sslrootcert={ca}",
            pg.port
        );
        assert_eq!(connect_ok(&options), (TLS_TRUST_ROLE.to_string(), true));
    }
    // The URL form, sslsni=0 changes nothing the server checks.
    let url = format!(
        "postgresql://{TLS_TRUST_ROLE}@localhost:{}/postgres?sslmode=verify-full&sslrootcert={ca}&sslsni=0",
        pg.port
    );
    assert_eq!(connect_ok(&url), (TLS_TRUST_ROLE.to_string(), true));
}

#[test]
fn verify_full_refuses_a_wrong_ca_and_a_host_name_the_certificate_lacks() {
    let Some(pg) = cluster() else { return };
    let base = format!("port={} user={TLS_TRUST_ROLE} dbname=postgres", pg.port);
    let wrong_ca = connect_err(&format!(
        "host=localhost {base} sslmode=verify-full sslrootcert={}",
        path(&pg.certs.wrong_ca)
    ));
    assert_contains(&wrong_ca, "invalid peer certificate: UnknownIssuer");
    // The name checked is `host`, not `hostaddr` (which only routes the TCP connection).
    let mismatch = connect_err(&format!(
        "host=db.invalid hostaddr=127.0.0.1 {base} sslmode=verify-full sslrootcert={}",
        path(&pg.certs.ca)
    ));
    assert_contains(&mismatch, "certificate not valid for name \"db.invalid\"");
}

/// `mode` checks the chain (a wrong CA is refused) but not the name.
fn checks_the_chain_but_not_the_name(mode: &str) {
    let Some(pg) = cluster() else { return };
    let base = format!(
        "host=db.invalid hostaddr=127.0.0.1 port={} user={TLS_TRUST_ROLE} dbname=postgres sslmode={mode}",
        pg.port
    );
    let wrong = connect_err(&format!("{base} sslrootcert={}", path(&pg.certs.wrong_ca)));
    assert_contains(&wrong, "UnknownIssuer");
    let right = connect_ok(&format!("{base} sslrootcert={}", path(&pg.certs.ca)));
    assert_eq!(right, (TLS_TRUST_ROLE.to_string(), true));
}

#[test]
fn verify_ca_accepts_a_name_mismatch_but_not_a_wrong_ca() {
    checks_the_chain_but_not_the_name("verify-ca");
}

/// libpq: "if a root CA file exists, the behavior of sslmode=require will be
/// the same as that of verify-ca".
#[test]
fn require_with_a_root_certificate_checks_the_chain_like_verify_ca() {
    checks_the_chain_but_not_the_name("require");
}

#[test]
fn tls_protocol_versions_are_bounded_as_asked() {
    let Some(pg) = cluster() else { return };
    let base = verify_full_to_localhost(&pg, TLS_TRUST_ROLE);
    for (bounds, version) in [
        ("ssl_max_protocol_version=TLSv1.2", "TLSv1.2"),
        ("ssl_min_protocol_version=TLSv1.3", "TLSv1.3"),
    ] {
        let read = connect_and_read(&format!("{base} {bounds}"), "version");
        assert_eq!(read.as_deref(), Ok(version), "{bounds}");
    }
}

#[test]
fn sslcrl_revoking_the_server_certificate_refuses_it() {
    let Some(pg) = cluster() else { return };
    let base = verify_full_to_localhost(&pg, TLS_TRUST_ROLE);
    let revoked = connect_err(&format!(
        "{base} sslcrl={}",
        path(&pg.certs.crl_revoking_server)
    ));
    assert_contains(&revoked, "Revoked");
    let fine = connect_ok(&format!("{base} sslcrl={}", path(&pg.certs.crl_empty)));
    assert_eq!(fine, (TLS_TRUST_ROLE.to_string(), true));
    // A named file without any CRL would check nothing: refused.
    let no_crl = connect_err(&format!("{base} sslcrl={}", path(&pg.certs.ca)));
    assert_contains(&no_crl, "no PEM certificate revocation list");
    // sslcrldir: every CRL file of the directory.
    let dir = pg.scratch("crldir");
    std::fs::copy(&pg.certs.crl_revoking_server, dir.join("a.r0")).unwrap();
    let revoked = connect_err(&format!("{base} sslcrldir={}", path(&dir)));
    assert_contains(&revoked, "Revoked");
}

#[test]
fn client_certificate_authenticates_its_role_and_nothing_else_does() {
    let Some(pg) = cluster() else { return };
    let base = verify_full_to_localhost(&pg, CERT_ROLE);
    let with_cert = format!(
        "{base} sslcert={} sslkey={}",
        path(&pg.certs.client_cert),
        path(&pg.certs.client_key)
    );
    assert_eq!(connect_ok(&with_cert), (CERT_ROLE.to_string(), true));
    // A named certificate that does not exist means none is sent (libpq);
    // the server then refuses the `cert` role.
    let without = connect_err(&format!(
        "{base} sslcert={}",
        path(&pg.root.join("absent.crt"))
    ));
    assert_contains(&without, "connection requires a valid client certificate");
    // sslcertmode=disable: the certificate is there but never sent.
    let disabled = connect_err(&format!("{with_cert} sslcertmode=disable"));
    assert_contains(&disabled, "connection requires a valid client certificate");
    // libpq's key-file permission rule, with a clear error before any connection.
    let open_key = pg.scratch("openkey").join("client.key");
    std::fs::copy(&pg.certs.client_key, &open_key).unwrap();
    set_mode(&open_key, 0o644);
    let error = connect_err(&format!(
        "{base} sslcert={} sslkey={}",
        path(&pg.certs.client_cert),
        path(&open_key)
    ));
    assert_contains(&error, "has group or world access");
}

#[test]
fn password_file_supplies_the_password_only_when_private() {
    let Some(pg) = cluster() else { return };
    // libpq's format: host:port:database:user:password; the first match wins.
    let matching = format!("localhost:{}:*:{PASSWORD_ROLE}:{PASSWORD}", pg.port);
    let passfile = pg.scratch_file(
        "pgpass",
        &format!("# test\nother:*:*:*:wrong\n{matching}\n"),
    );
    set_mode(&passfile, 0o600);
    let url = format!(
        "postgresql://{PASSWORD_ROLE}@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}&passfile={}",
        pg.port,
        path(&pg.certs.ca),
        path(&passfile)
    );
    assert_eq!(connect_ok(&url), (PASSWORD_ROLE.to_string(), true));
    // Group/world-readable: ignored (a warning is logged), so no password is
    // sent and the server's password request fails.
    set_mode(&passfile, 0o644);
    let error = connect_err(&url);
    assert_contains(&error, "password missing");
    assert_contains(
        &error,
        "has group or world access; permissions should be u=rw (0600)",
    );
    assert!(!error.contains(PASSWORD), "{error}");
}

#[test]
fn service_file_supplies_host_port_and_dbname() {
    let Some(pg) = cluster() else { return };
    let file = pg.scratch_file(
        "pg_service.conf",
        &format!(
            "[other]\nhost=db.invalid\n[hub]\nhost=localhost\nport={}\ndbname=postgres\n\
             sslmode=verify-full\nsslrootcert={}\nuser={CERT_ROLE}\n",
            pg.port,
            path(&pg.certs.ca)
        ),
    );
    // Explicit options win over the service's (user here).
    let options = format!(
        "service=hub servicefile={} user={TLS_TRUST_ROLE}",
        path(&file)
    );
    assert_eq!(connect_ok(&options), (TLS_TRUST_ROLE.to_string(), true));
    let error = connect_err(&format!("service=absent servicefile={}", path(&file)));
    assert_contains(&error, "definition of service \"absent\" not found");
}

#[test]
fn allow_and_prefer_make_the_second_attempt_libpq_makes() {
    let Some(pg) = cluster() else { return };
    let host = format!("host=localhost port={} dbname=postgres", pg.port);
    // allow: plain first; this role has only a hostssl line, so TLS second.
    let allow = connect_ok(&format!("{host} user={TLS_TRUST_ROLE} sslmode=allow"));
    assert_eq!(allow, (TLS_TRUST_ROLE.to_string(), true));
    // prefer: TLS first; this role has only a hostnossl line, so plain second.
    let prefer = connect_ok(&format!("{host} user={PLAIN_ONLY_ROLE} sslmode=prefer"));
    assert_eq!(prefer, (PLAIN_ONLY_ROLE.to_string(), false));
    // prefer with a root certificate checks the chain; a failed check falls back to plain too.
    let checked = connect_ok(&format!(
        "{host} user={PLAIN_ONLY_ROLE} sslmode=prefer sslrootcert={}",
        path(&pg.certs.wrong_ca)
    ));
    assert_eq!(checked, (PLAIN_ONLY_ROLE.to_string(), false));
    // Both attempts' reasons are shown when both fail.
    let error = connect_err(&format!("{host} user=nobody_here sslmode=prefer"));
    assert_contains(&error, "then without TLS");
}

/// The environment and the home directory (`PGSSLMODE`, `PGSERVICE`,
/// `PGSERVICEFILE`, `PGSYSCONFDIR`, `~/.postgresql/root.crt`,
/// `~/.postgresql/postgresql.crt`/`.key`, `~/.pgpass`) are process-wide, so
/// the checks that set them run in a child process of their own: this test
/// binary again, running only [`environment_and_home_defaults_child`].
#[test]
fn environment_and_home_defaults_like_libpq() {
    if let Some(why) = missing_tools() {
        let _: Option<()> = support_pg::skip_or_fail(false, &why);
        return;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "environment_and_home_defaults_child",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
#[ignore = "run in a child process by environment_and_home_defaults_like_libpq"]
fn environment_and_home_defaults_child() {
    let Some(pg) = cluster() else { return };
    let home = pg.scratch("home");
    let dot_postgresql = home.join(".postgresql");
    std::fs::create_dir(&dot_postgresql).unwrap();
    // Only this process's thread runs now: setting the environment is safe.
    std::env::set_var("HOME", &home);
    for name in [
        "PGSSLMODE",
        "PGSSLROOTCERT",
        "PGSSLCERT",
        "PGSSLKEY",
        "PGPASSFILE",
    ] {
        std::env::remove_var(name);
    }
    let localhost = format!("host=localhost port={} dbname=postgres", pg.port);
    let trust = format!("{localhost} user={TLS_TRUST_ROLE}");
    let root_crt = dot_postgresql.join("root.crt");

    // require + ~/.postgresql/root.crt behaves as verify-ca.
    std::fs::copy(&pg.certs.wrong_ca, &root_crt).unwrap();
    assert_contains(
        &connect_err(&format!("{trust} sslmode=require")),
        "UnknownIssuer",
    );
    std::fs::copy(&pg.certs.ca, &root_crt).unwrap();
    let mismatch = format!(
        "host=db.invalid hostaddr=127.0.0.1 port={} dbname=postgres user={TLS_TRUST_ROLE}",
        pg.port
    );
    assert_eq!(
        connect_ok(&format!("{mismatch} sslmode=require")),
        (TLS_TRUST_ROLE.to_string(), true)
    );

    // PGSSLMODE applies when the options name no sslmode; the options win.
    std::env::set_var("PGSSLMODE", "verify-full");
    assert_contains(&connect_err(&mismatch), "not valid for name");
    assert_eq!(
        connect_ok(&format!("{mismatch} sslmode=verify-ca")),
        (TLS_TRUST_ROLE.to_string(), true)
    );
    // Without any root certificate, verify-full is refused before connecting.
    std::fs::remove_file(&root_crt).unwrap();
    assert_contains(&connect_err(&trust), "root.crt\" does not exist");
    std::env::set_var("PGSSLROOTCERT", &pg.certs.ca);
    assert_eq!(connect_ok(&trust), (TLS_TRUST_ROLE.to_string(), true));

    // The default client certificate is sent when ~/.postgresql/postgresql.crt exists.
    let cert_role = format!("{localhost} user={CERT_ROLE}");
    assert_contains(
        &connect_err(&cert_role),
        "connection requires a valid client certificate",
    );
    std::fs::copy(&pg.certs.client_cert, dot_postgresql.join("postgresql.crt")).unwrap();
    let key = dot_postgresql.join("postgresql.key");
    std::fs::copy(&pg.certs.client_key, &key).unwrap();
    set_mode(&key, 0o640);
    assert_contains(&connect_err(&cert_role), "has group or world access");
    set_mode(&key, 0o600);
    assert_eq!(connect_ok(&cert_role), (CERT_ROLE.to_string(), true));

    // ~/.pgpass when no password is given.
    let pgpass = home.join(".pgpass");
    let line = format!(
        "localhost:{}:postgres:{PASSWORD_ROLE}:{PASSWORD}\n",
        pg.port
    );
    std::fs::write(&pgpass, line).unwrap();
    set_mode(&pgpass, 0o600);
    let password_role = format!("{localhost} user={PASSWORD_ROLE}");
    assert_eq!(
        connect_ok(&password_role),
        (PASSWORD_ROLE.to_string(), true)
    );

    // PGSERVICE, found in $PGSYSCONFDIR/pg_service.conf when the per-user
    // file (PGSERVICEFILE) does not exist.
    let sysconf = pg.scratch("sysconf");
    std::fs::write(
        sysconf.join("pg_service.conf"),
        format!(
            "[envsvc]\nhost=localhost\nport={}\ndbname=postgres\n",
            pg.port
        ),
    )
    .unwrap();
    std::env::set_var("PGSYSCONFDIR", &sysconf);
    std::env::set_var("PGSERVICEFILE", home.join("absent.conf"));
    std::env::set_var("PGSERVICE", "envsvc");
    assert_eq!(
        connect_ok(&format!("user={TLS_TRUST_ROLE}")),
        (TLS_TRUST_ROLE.to_string(), true)
    );

    // An environment variable naming a refused feature is refused, not ignored.
    std::env::set_var("PGREQUIREAUTH", "scram-sha-256");
    let refused = connect_err(&format!("user={TLS_TRUST_ROLE}"));
    assert_contains(&refused, "`require_auth` is not supported");
    assert_contains(&refused, "(from PGREQUIREAUTH)");
}
