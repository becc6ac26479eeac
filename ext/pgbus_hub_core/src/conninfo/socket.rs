//! The connection's socket, opened here (in tokio-postgres' host order, with
//! its timeouts and keepalives) rather than by tokio-postgres, so that its
//! descriptor is known. Puma forks workers after the hub connected: every
//! worker holds a copy of this socket, so closing it here closes one
//! descriptor and ends nothing; the server would keep the backend LISTENing,
//! unread, and the notification queue would never drain. A connection the
//! owner gives up is therefore severed with shutdown(2), which acts on the
//! socket itself (see [`Sever`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_postgres::config::{Host, LoadBalanceHosts};
use tokio_postgres::Config;

use crate::os;
use crate::process::Owner;

/// A TCP or Unix-domain stream to the server.
pub struct PgSocket {
    stream: Stream,
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl PgSocket {
    /// Shuts the socket down (both directions) when the returned guard is
    /// told to, in this process only.
    pub fn sever_handle(&self) -> Sever {
        Sever {
            fd: self.as_raw_fd(),
            owner: Owner::current(),
        }
    }
}

impl AsRawFd for PgSocket {
    fn as_raw_fd(&self) -> RawFd {
        match &self.stream {
            Stream::Tcp(stream) => stream.as_raw_fd(),
            Stream::Unix(stream) => stream.as_raw_fd(),
        }
    }
}

/// shutdown(2) of a connection's socket. Only valid while the connection
/// (which owns the descriptor) is alive: callers sever it before they drop
/// it, or while its driver task is known not to have ended.
#[derive(Clone, Copy, Debug)]
pub struct Sever {
    fd: RawFd,
    owner: Owner,
}

impl Sever {
    /// Ends the connection for every process holding a copy of its socket:
    /// the server reads EOF and ends the backend. Nothing in a forked child
    /// (the socket is the parent's connection).
    pub fn sever(self) {
        if self.owner.is_current() {
            // SAFETY: the descriptor is open (see the type's doc); shutdown
            // does not close it.
            unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
        }
    }
}

macro_rules! each_stream {
    ($self:ident, $stream:ident => $body:expr) => {
        match &mut $self.get_mut().stream {
            Stream::Tcp($stream) => {
                let $stream = Pin::new($stream);
                $body
            }
            Stream::Unix($stream) => {
                let $stream = Pin::new($stream);
                $body
            }
        }
    };
}

impl AsyncRead for PgSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        each_stream!(self, stream => stream.poll_read(cx, buf))
    }
}

impl AsyncWrite for PgSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each_stream!(self, stream => stream.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_stream!(self, stream => stream.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_stream!(self, stream => stream.poll_shutdown(cx))
    }
}

/// One host to try: where, and the name TLS checks (None for a socket directory).
pub struct Target {
    host: Host,
    pub hostname: Option<String>,
    port: u16,
}

/// The hosts in the order tokio-postgres tries them (`hostaddr` over `host`
/// for the address, `host` for the TLS name; shuffled with `load_balance_hosts=random`).
pub fn targets(config: &Config) -> Result<Vec<Target>, String> {
    let (hosts, hostaddrs, ports) = (
        config.get_hosts(),
        config.get_hostaddrs(),
        config.get_ports(),
    );
    if hosts.is_empty() && hostaddrs.is_empty() {
        return Err("both host and hostaddr are missing".into());
    }
    if !hosts.is_empty() && !hostaddrs.is_empty() && hosts.len() != hostaddrs.len() {
        return Err(format!(
            "number of hosts ({}) is different from number of hostaddrs ({})",
            hosts.len(),
            hostaddrs.len()
        ));
    }
    let count = hosts.len().max(hostaddrs.len());
    if ports.len() > 1 && ports.len() != count {
        return Err("invalid number of ports".into());
    }
    let mut targets: Vec<Target> = (0..count)
        .map(|i| {
            let host = hosts.get(i);
            let hostname = match host {
                Some(Host::Tcp(name)) => Some(name.clone()),
                _ => None,
            };
            let address = match hostaddrs.get(i) {
                Some(ip) => Host::Tcp(ip.to_string()),
                None => host.cloned().unwrap_or_else(|| Host::Tcp(String::new())),
            };
            let port = ports
                .get(i)
                .or_else(|| ports.first())
                .copied()
                .unwrap_or(5432);
            Target {
                host: address,
                hostname,
                port,
            }
        })
        .collect();
    if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
        shuffle(&mut targets);
    }
    Ok(targets)
}

/// Fisher-Yates with the clock's nanoseconds (no RNG crate for a host order).
fn shuffle<T>(items: &mut [T]) {
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        | 1;
    for i in (1..items.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        items.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

impl Target {
    /// The addresses of this host (one for a socket directory or an IP).
    pub async fn addresses(&self, config: &Config) -> Result<Vec<Address>, String> {
        match &self.host {
            Host::Unix(dir) => Ok(vec![Address::Unix(
                dir.join(format!(".s.PGSQL.{}", self.port)),
            )]),
            Host::Tcp(name) => {
                let mut addrs: Vec<Address> = tokio::net::lookup_host((name.as_str(), self.port))
                    .await
                    .map_err(|e| format!("error connecting to server: {e}"))?
                    .map(|addr: SocketAddr| Address::Tcp(addr.ip(), self.port))
                    .collect();
                if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
                    shuffle(&mut addrs);
                }
                if addrs.is_empty() {
                    return Err(
                        "error connecting to server: could not resolve any addresses".into(),
                    );
                }
                Ok(addrs)
            }
        }
    }
}

pub enum Address {
    Tcp(IpAddr, u16),
    Unix(PathBuf),
}

impl Address {
    /// Connects within `connect_timeout`, with tokio-postgres' socket options
    /// (TCP_NODELAY, `tcp_user_timeout`, keepalives).
    pub async fn connect(&self, config: &Config) -> Result<PgSocket, String> {
        let timeout = config.get_connect_timeout().copied();
        let stream = match self {
            Address::Tcp(ip, port) => {
                let stream = within(timeout, TcpStream::connect((*ip, *port))).await?;
                stream.set_nodelay(true).map_err(connect_error)?;
                tcp_options(&stream, config).map_err(connect_error)?;
                Stream::Tcp(stream)
            }
            Address::Unix(path) => Stream::Unix(within(timeout, UnixStream::connect(path)).await?),
        };
        Ok(PgSocket { stream })
    }
}

async fn within<T>(
    timeout: Option<Duration>,
    connect: impl std::future::Future<Output = io::Result<T>>,
) -> Result<T, String> {
    match timeout {
        Some(timeout) => match tokio::time::timeout(timeout, connect).await {
            Ok(connected) => connected.map_err(connect_error),
            Err(_) => Err("error connecting to server: connection timed out".into()),
        },
        None => connect.await.map_err(connect_error),
    }
}

fn connect_error(error: io::Error) -> String {
    format!("error connecting to server: {error}")
}

fn tcp_options(stream: &TcpStream, config: &Config) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    // Where the OS has no TCP_USER_TIMEOUT the setting is skipped, as libpq does.
    if let (Some(timeout), Some(option)) = (config.get_tcp_user_timeout(), os::TCP_USER_TIMEOUT) {
        let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        set(fd, libc::IPPROTO_TCP, option, millis)?;
    }
    if config.get_keepalives() {
        set(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
        set(
            fd,
            libc::IPPROTO_TCP,
            os::TCP_KEEPALIVE_IDLE,
            seconds(config.get_keepalives_idle()),
        )?;
        if let Some(interval) = config.get_keepalives_interval() {
            set(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_KEEPINTVL,
                seconds(interval),
            )?;
        }
        if let Some(retries) = config.get_keepalives_retries() {
            let retries = libc::c_int::try_from(retries).unwrap_or(libc::c_int::MAX);
            set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, retries)?;
        }
    }
    Ok(())
}

fn seconds(duration: Duration) -> libc::c_int {
    libc::c_int::try_from(duration.as_secs().max(1)).unwrap_or(libc::c_int::MAX)
}

fn set(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid socket fd and a c_int option value of the right size.
    let done = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
