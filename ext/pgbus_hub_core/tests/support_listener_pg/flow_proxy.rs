// A TCP proxy whose connections are frozen one at a time (include!d: items,
// no mods). support_pg's FreezableProxy freezes every open flow at once; a
// standby test needs the serving connection's path frozen while the
// standby's flows on.

/// Forwards each connection to the test server (TCP only); connection `i`
/// (in accept order) can be frozen: nothing forwarded either way, nothing
/// closed, until thawed (a NAT entry lost for that flow alone).
struct FlowProxy {
    url: String,
    flows: Arc<std::sync::Mutex<Vec<Arc<std::sync::atomic::AtomicBool>>>>,
}

impl FlowProxy {
    fn start(url: &str) -> Self {
        use tokio_postgres::config::Host;
        let options = ConnectionOptions::parse(url).unwrap();
        let config = options.config();
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let upstream = match config.get_hosts().first() {
            Some(Host::Tcp(host)) => format!("{host}:{port}"),
            other => panic!("FlowProxy forwards to a TCP host, not {other:?}"),
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut url = format!(
            "host=127.0.0.1 port={} dbname={} user={}",
            listener.local_addr().unwrap().port(),
            config.get_dbname().unwrap_or("postgres"),
            config.get_user().unwrap_or("postgres"),
        );
        if let Some(password) = config.get_password() {
            url += &format!(" password={}", String::from_utf8_lossy(password));
        }
        let flows: Arc<std::sync::Mutex<Vec<Arc<std::sync::atomic::AtomicBool>>>> =
            Arc::default();
        let accepted = Arc::clone(&flows);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let server = std::net::TcpStream::connect(&upstream).unwrap();
                let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
                accepted.lock().unwrap().push(Arc::clone(&frozen));
                pump(client.try_clone().unwrap(), server.try_clone().unwrap(), Arc::clone(&frozen));
                pump(server, client, frozen);
            }
        });
        Self { url, flows }
    }

    /// Connections accepted so far.
    fn flows(&self) -> usize {
        self.flows.lock().unwrap().len()
    }

    fn set(&self, index: usize, frozen: bool) {
        self.flows.lock().unwrap()[index].store(frozen, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` on a thread of its own, holding what it read while
/// `frozen`; an end (either side's) closes both, once thawed.
fn pump(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    frozen: Arc<std::sync::atomic::AtomicBool>,
) {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16384];
        loop {
            let n = from.read(&mut buffer).unwrap_or(0);
            // The proxy's freeze, not an alignment: it holds bytes as a dead path would.
            while frozen.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            if n == 0 || to.write_all(&buffer[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
        let _ = from.shutdown(std::net::Shutdown::Both);
    });
}
