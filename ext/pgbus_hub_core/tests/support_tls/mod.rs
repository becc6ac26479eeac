//! A private PostgreSQL cluster with TLS, for the connection tests: its own
//! temp directory (data, socket, certificates), its own free port, a test CA
//! made here with the `openssl` CLI, stopped and removed on Drop (also when
//! the test fails). Tests run as root, so the server runs as `postgres`
//! through `runuser`.

#![allow(dead_code)]

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// The PostgreSQL binaries: PGBUS_HUB_PG_BIN (the release stages of `rake
/// postgres` name each release's), else the newest Debian package installed.
fn pg_bin() -> PathBuf {
    if let Ok(bin) = std::env::var("PGBUS_HUB_PG_BIN") {
        return PathBuf::from(bin);
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .max();
    PathBuf::from(format!("/usr/lib/postgresql/{}/bin", newest.unwrap_or(0)))
}
/// The OS user the server runs as (initdb refuses root).
const PG_OS_USER: &str = "postgres";
/// Certificates live two days: long enough for any run, short enough to be
/// plainly throwaway.
const CERT_DAYS: &str = "2";

/// Roles, each matched by its own pg_hba line.
pub const CERT_ROLE: &str = "tls_cert_user";
pub const PASSWORD_ROLE: &str = "tls_password_user";
pub const PASSWORD: &str = "pgbus-hub-tls-secret";
pub const TLS_TRUST_ROLE: &str = "tls_trust_user";
pub const PLAIN_ONLY_ROLE: &str = "tls_plain_user";

/// Files made by [`PrivateCluster::start`].
pub struct Certs {
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// A CA that signed nothing here.
    pub wrong_ca: PathBuf,
    /// Client certificate and key for [`CERT_ROLE`] (key mode 0600).
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CRL of [`Certs::ca`] revoking the server certificate, and one revoking nothing.
    pub crl_revoking_server: PathBuf,
    pub crl_empty: PathBuf,
}

pub struct PrivateCluster {
    pub root: PathBuf,
    pub port: u16,
    pub socket_dir: PathBuf,
    pub certs: Certs,
    data: PathBuf,
    started: bool,
}

/// Why the cluster cannot be made here, or None when it can. Binaries named
/// by PGBUS_HUB_PG_BIN that are not there fail the test instead: that run
/// asked for a release.
pub fn missing_tools() -> Option<String> {
    let initdb = pg_bin().join("initdb");
    if !initdb.exists() {
        assert!(
            std::env::var_os("PGBUS_HUB_PG_BIN").is_none(),
            "PGBUS_HUB_PG_BIN: {} not found",
            initdb.display()
        );
        return Some(format!("{} not found", initdb.display()));
    }
    for tool in ["openssl", "runuser"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            return Some(format!("{tool} not found"));
        }
    }
    None
}

fn run(what: &str, command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        output.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `args` split on whitespace (none of ours contains any).
fn openssl(dir: &Path, what: &str, args: &str) {
    run(
        what,
        Command::new("openssl")
            .current_dir(dir)
            .args(args.split_whitespace()),
    );
}

fn as_postgres(what: &str, program: &str, args: &[&str]) {
    let binary = pg_bin().join(program);
    run(
        what,
        Command::new("runuser")
            .args(["-u", PG_OS_USER, "--"])
            .arg(binary)
            .args(args),
    );
}

fn chown_postgres(path: &Path) {
    run(
        "chown",
        Command::new("chown")
            .args(["-R", &format!("{PG_OS_USER}:{PG_OS_USER}")])
            .arg(path),
    );
}

pub fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A port nobody listens on now (the kernel's pick; released at once).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

/// A new unencrypted P-256 key (fast to make, and ring verifies it).
const NEW_KEY: &str = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

/// A self-signed CA.
fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        "CA",
        &format!(
            "req -x509 {NEW_KEY} -keyout {name}.key -out {name}.crt -days {CERT_DAYS} \
             -subj /CN=pgbus-hub-{name} -addext basicConstraints=critical,CA:TRUE \
             -addext keyUsage=critical,keyCertSign,cRLSign"
        ),
    );
}

/// A leaf key and certificate signed by `ca.crt`, with the given extensions.
fn make_leaf(dir: &Path, name: &str, subject: &str, extensions: &str) {
    std::fs::write(dir.join(format!("{name}.ext")), extensions).unwrap();
    openssl(
        dir,
        "leaf request",
        &format!("req -new {NEW_KEY} -keyout {name}.key -out {name}.csr -subj {subject}"),
    );
    openssl(
        dir,
        "leaf signature",
        &format!(
            "x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
             -days {CERT_DAYS} -out {name}.crt -extfile {name}.ext"
        ),
    );
}

/// Two CRLs of the CA: one revoking `server.crt`, one empty. `openssl ca`
/// needs a small database and configuration of its own.
fn make_crls(dir: &Path) {
    std::fs::write(dir.join("index.txt"), "").unwrap();
    std::fs::write(dir.join("crlnumber"), "01\n").unwrap();
    std::fs::write(
        dir.join("ca.cnf"),
        "[ca]\ndefault_ca = test\n[test]\ndatabase = index.txt\ncrlnumber = crlnumber\n\
         certificate = ca.crt\nprivate_key = ca.key\ndefault_md = sha256\ndefault_crl_days = 2\n",
    )
    .unwrap();
    let gencrl = |out: &str| {
        openssl(dir, "CRL", &format!("ca -config ca.cnf -gencrl -out {out}"));
    };
    gencrl("empty.crl");
    openssl(dir, "revoke", "ca -config ca.cnf -revoke server.crt");
    gencrl("revoking-server.crl");
}

impl PrivateCluster {
    /// initdb, certificates, `ssl=on`, pg_hba, start, roles. Panics (after
    /// cleaning up, through Drop) on any failure.
    pub fn start() -> PrivateCluster {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let root = std::env::temp_dir().join(format!(
            "pgbus-hub-tls-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        // postgres must traverse into its data, socket and certificate directories.
        set_mode(&root, 0o755);
        let certs_dir = root.join("certs");
        std::fs::create_dir(&certs_dir).unwrap();
        set_mode(&certs_dir, 0o755);
        let mut cluster = PrivateCluster {
            port: free_port(),
            socket_dir: root.join("sock"),
            data: root.join("data"),
            certs: Certs {
                ca: certs_dir.join("ca.crt"),
                wrong_ca: certs_dir.join("wrong-ca.crt"),
                client_cert: certs_dir.join("client.crt"),
                client_key: certs_dir.join("client.key"),
                crl_revoking_server: certs_dir.join("revoking-server.crl"),
                crl_empty: certs_dir.join("empty.crl"),
            },
            root,
            started: false,
        };
        make_ca(&certs_dir, "ca");
        make_ca(&certs_dir, "wrong-ca");
        make_leaf(
            &certs_dir,
            "server",
            "/CN=localhost",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n",
        );
        make_leaf(
            &certs_dir,
            "client",
            &format!("/CN={CERT_ROLE}"),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
        );
        make_crls(&certs_dir);
        set_mode(&cluster.certs.client_key, 0o600);
        for file in ["ca.crt", "server.crt", "server.key"] {
            chown_postgres(&certs_dir.join(file));
        }
        set_mode(&certs_dir.join("server.key"), 0o600);
        cluster.init_and_start(&certs_dir);
        cluster
    }

    fn init_and_start(&mut self, certs_dir: &Path) {
        std::fs::create_dir(&self.data).unwrap();
        std::fs::create_dir(&self.socket_dir).unwrap();
        chown_postgres(&self.data);
        chown_postgres(&self.socket_dir);
        let data = self.data.to_str().unwrap().to_string();
        as_postgres(
            "initdb",
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                PG_OS_USER,
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        let certs = certs_dir.display();
        let settings = format!(
            "\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             ssl = on\nssl_cert_file = '{certs}/server.crt'\nssl_key_file = '{certs}/server.key'\n\
             ssl_ca_file = '{certs}/ca.crt'\npassword_encryption = 'scram-sha-256'\n\
             fsync = off\nmax_connections = 20\nshared_buffers = '16MB'\n",
            self.port,
            self.socket_dir.display()
        );
        append(&self.data.join("postgresql.conf"), &settings);
        std::fs::write(
            self.data.join("pg_hba.conf"),
            format!(
                "local all all trust\n\
                 hostssl all {CERT_ROLE} 127.0.0.1/32 cert\n\
                 hostssl all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n\
                 hostssl all {TLS_TRUST_ROLE} 127.0.0.1/32 trust\n\
                 hostnossl all {PLAIN_ONLY_ROLE} 127.0.0.1/32 trust\n"
            ),
        )
        .unwrap();
        let log = self.root.join("postgres.log");
        std::fs::write(&log, "").unwrap();
        chown_postgres(&log);
        as_postgres(
            "pg_ctl start",
            "pg_ctl",
            &[
                "-D",
                &data,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
        self.started = true;
        let mut admin = postgres::Client::connect(
            &format!(
                "host={} port={} user={PG_OS_USER} dbname=postgres",
                self.socket_dir.display(),
                self.port
            ),
            postgres::NoTls,
        )
        .expect("admin connection over the socket");
        admin
            .batch_execute(&format!(
                "CREATE ROLE {CERT_ROLE} LOGIN; CREATE ROLE {TLS_TRUST_ROLE} LOGIN; \
                 CREATE ROLE {PLAIN_ONLY_ROLE} LOGIN; \
                 CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD '{PASSWORD}';"
            ))
            .expect("roles");
    }

    /// A fresh directory of the test's own under the cluster's (removed with it).
    pub fn scratch(&self, name: &str) -> PathBuf {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A file `name` holding `text`, in a scratch directory of its own.
    pub fn scratch_file(&self, name: &str, text: &str) -> PathBuf {
        let file = self.scratch(name).join(name);
        std::fs::write(&file, text).unwrap();
        file
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        if self.started {
            let _ = Command::new("runuser")
                .args(["-u", PG_OS_USER, "--"])
                .arg(pg_bin().join("pg_ctl"))
                .args([
                    "-D",
                    self.data.to_str().unwrap_or_default(),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
