// A TCP proxy whose connections are frozen or slowed one at a time
// (include!d: items, no mods). support_pg's FreezableProxy freezes every
// open flow at once; a standby test needs the serving connection's path
// frozen or slow while the standby's flows on.

/// One proxied connection's path.
#[derive(Default)]
struct Flow {
    /// Nothing forwarded either way, nothing closed, until thawed.
    frozen: std::sync::atomic::AtomicBool,
    /// The server's bytes reach the client this many milliseconds late (a
    /// path with that latency), in order.
    delay_ms: std::sync::atomic::AtomicU64,
}

/// Forwards each connection to the test server (TCP only); connection `i`
/// (in accept order) can be frozen (a NAT entry lost for that flow alone)
/// or slowed.
struct FlowProxy {
    url: String,
    flows: Arc<std::sync::Mutex<Vec<Arc<Flow>>>>,
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
        let flows: Arc<std::sync::Mutex<Vec<Arc<Flow>>>> = Arc::default();
        let accepted = Arc::clone(&flows);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let server = std::net::TcpStream::connect(&upstream).unwrap();
                let flow = Arc::new(Flow::default());
                accepted.lock().unwrap().push(Arc::clone(&flow));
                pump(client.try_clone().unwrap(), server.try_clone().unwrap(), Arc::clone(&flow), false);
                pump(server, client, flow, true);
            }
        });
        Self { url, flows }
    }

    /// Connections accepted so far.
    fn flows(&self) -> usize {
        self.flows.lock().unwrap().len()
    }

    fn set(&self, index: usize, frozen: bool) {
        self.flows.lock().unwrap()[index]
            .frozen
            .store(frozen, Ordering::SeqCst);
    }

    fn delay(&self, index: usize, delay: Duration) {
        let millis = u64::try_from(delay.as_millis()).unwrap();
        self.flows.lock().unwrap()[index]
            .delay_ms
            .store(millis, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` on threads of its own, holding what it read while
/// the flow is frozen and (`delayed`: the server's direction) each chunk
/// until its delay from when it was read passed; an end (either side's)
/// closes both, once thawed.
fn pump(mut from: std::net::TcpStream, mut to: std::net::TcpStream, flow: Arc<Flow>, delayed: bool) {
    use std::io::{Read, Write};
    let (chunks, read) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16384];
        loop {
            let n = from.read(&mut buffer).unwrap_or(0);
            if chunks.send((Instant::now(), buffer[..n].to_vec())).is_err() || n == 0 {
                break;
            }
        }
        let _ = from.shutdown(std::net::Shutdown::Both);
    });
    std::thread::spawn(move || {
        for (at, chunk) in read {
            // The proxy's path, not an alignment: it holds bytes as a dead
            // or slow path would.
            while flow.frozen.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            if delayed {
                let due = at + Duration::from_millis(flow.delay_ms.load(Ordering::SeqCst));
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            if chunk.is_empty() || to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}
