//! Opening a connection: the one place every connection is made, so each gets
//! the same census tag, TLS policy, deadline and post-connect `SET`s.

use std::fmt;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::config::{SslMode, TargetSessionAttrs};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{AsyncMessage, Client, Config, Notification};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::socket::{self, PgSocket, Sever};
use super::{ConnectionOptions, PgConnection, TlsPolicy};

/// Whole-connect deadline when the options set no `connect_timeout`. libpq
/// waits forever, but a listener stuck in a half-open handshake would never
/// retry; 10 s covers a cross-region TCP + TLS + SCRAM handshake many times over.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The connection's server-to-client traffic that is not a query response.
#[derive(Debug)]
pub enum ServerMessage {
    Notification(Notification),
    /// The connection ended; the reason (an I/O or protocol error, a FATAL from
    /// `pg_terminate_backend`, a malformed or non-UTF-8 message, ...). Always the last message.
    Lost(String),
}

/// A live connection: the client, its out-of-band messages (notifications, in
/// server order), and the task driving the socket.
pub struct Connected {
    pub client: Client,
    pub messages: mpsc::UnboundedReceiver<ServerMessage>,
    pub driver: JoinHandle<()>,
    /// shutdown(2) of the driver's socket (valid while the driver runs).
    sever: Sever,
}

impl Connected {
    /// Drop the client (tokio-postgres then sends Terminate and shuts the
    /// socket down), wait up to `grace` for that; a driver still running then
    /// (a stalled server still owes it an answer) has its socket severed
    /// before it is aborted: closing our descriptor alone would leave the
    /// backend LISTENing while a forked worker holds a copy of the socket.
    pub async fn close(self, grace: Duration) {
        let Connected {
            client,
            messages,
            mut driver,
            sever,
        } = self;
        drop(client);
        drop(messages);
        if tokio::time::timeout(grace, &mut driver).await.is_err() {
            // The runtime runs one thread and nothing awaits between this
            // check and the shutdown: a driver not finished still owns the
            // descriptor, so it cannot have been closed and reused.
            if !driver.is_finished() {
                sever.sever();
            }
            driver.abort();
        }
    }
}

/// An error while connecting: the reason, never containing the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError(pub String);

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnectError {}

impl ConnectionOptions {
    /// Open a connection, spawn its driver on the current tokio runtime, run
    /// the `variables` `SET`s. The whole sequence is bounded by
    /// `connect_timeout` (or [`DEFAULT_CONNECT_TIMEOUT`]).
    pub async fn connect(&self) -> Result<Connected, ConnectError> {
        let deadline = self
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        match tokio::time::timeout(deadline, self.connect_inner()).await {
            Ok(result) => result,
            Err(_) => Err(ConnectError(format!(
                "connect to {self} timed out after {deadline:?}"
            ))),
        }
    }

    async fn connect_inner(&self) -> Result<Connected, ConnectError> {
        let connector = self
            .tls
            .connector()
            .map_err(|e| ConnectError(format!("connect to {self} failed: {}", e.0)))?;
        // libpq's allow and prefer make a second attempt the other way when
        // the first fails; the error then tells both.
        let attempts: &[SslMode] = match self.tls.policy {
            TlsPolicy::Disable => &[SslMode::Disable],
            TlsPolicy::Allow => &[SslMode::Disable, SslMode::Require],
            TlsPolicy::Prefer => &[SslMode::Prefer, SslMode::Disable],
            TlsPolicy::Require | TlsPolicy::VerifyCa | TlsPolicy::VerifyFull => &[SslMode::Require],
        };
        let mut failures = Vec::new();
        let mut opened = None;
        for &mode in attempts {
            let mut config = self.config.clone();
            config.ssl_mode(mode);
            match open(&config, &connector).await {
                Ok(pair) => {
                    opened = Some(pair);
                    break;
                }
                Err(error) => failures.push(error),
            }
        }
        let Some((client, mut connection, sever)) = opened else {
            let reason = match failures.as_slice() {
                [only] => only.clone(),
                [with_first, with_second] => format!(
                    "{with_first}; then {} TLS: {with_second}",
                    if attempts[1] == SslMode::Disable {
                        "without"
                    } else {
                        "with"
                    }
                ),
                _ => failures.join("; "),
            };
            let note = match &self.passfile_ignored {
                Some(ignored) => format!(" (note: {ignored})"),
                None => String::new(),
            };
            return Err(ConnectError(format!(
                "connect to {self} failed: {reason}{note}"
            )));
        };
        let (sender, messages) = mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            let reason = loop {
                match futures_util::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(notification))) => {
                        // A send error means the engine dropped its receiver;
                        // keep driving until the client is dropped too.
                        let _ = sender.send(ServerMessage::Notification(notification));
                    }
                    Some(Ok(_notice)) => {}
                    Some(Err(error)) => break describe(&error),
                    None => break "the server closed the connection".to_string(),
                }
            };
            // The connection still owns its socket here: however it ended
            // (an I/O or protocol error included), the server is told, even
            // while forked workers hold copies of the descriptor.
            sever.sever();
            let _ = sender.send(ServerMessage::Lost(reason));
        });
        let connected = Connected {
            client,
            messages,
            driver,
            sever,
        };
        let sql = self
            .variables_sql()
            .map_err(|e| ConnectError(format!("variables: {e}")))?;
        if !sql.is_empty() {
            if let Err(error) = connected.client.batch_execute(&sql).await {
                let reason = format!("applying variables failed: {}", describe(&error));
                connected.close(Duration::from_millis(100)).await;
                return Err(ConnectError(reason));
            }
        }
        Ok(connected)
    }
}

/// tokio-postgres' `Config::connect` on a socket of our own (its descriptor
/// is what [`Sever`] needs): each host in its order, each address of a
/// host, then `target_session_attrs`. The last failure's reason.
async fn open(
    config: &Config,
    connector: &MakeRustlsConnect,
) -> Result<(Client, PgConnection, Sever), String> {
    let mut last = String::from("no host to connect to");
    for target in socket::targets(config)? {
        let addresses = match target.addresses(config).await {
            Ok(addresses) => addresses,
            Err(error) => {
                last = error;
                continue;
            }
        };
        for address in addresses {
            match open_at(config, connector, &target, &address).await {
                Ok(opened) => return Ok(opened),
                Err(error) => last = error,
            }
        }
    }
    Err(last)
}

async fn open_at(
    config: &Config,
    connector: &MakeRustlsConnect,
    target: &socket::Target,
    address: &socket::Address,
) -> Result<(Client, PgConnection, Sever), String> {
    let socket = address.connect(config).await?;
    let sever = socket.sever_handle();
    let tls = <MakeRustlsConnect as MakeTlsConnect<PgSocket>>::make_tls_connect(
        &mut connector.clone(),
        target.hostname.as_deref().unwrap_or(""),
    )
    .map_err(|e| e.to_string())?;
    let (client, mut connection) = config
        .connect_raw(socket, tls)
        .await
        .map_err(|e| describe(&e))?;
    if let Err(error) = session_attrs(config, &client, &mut connection).await {
        sever.sever();
        return Err(error);
    }
    Ok((client, connection, sever))
}

/// `target_session_attrs=read-write|read-only`, as tokio-postgres checks it
/// (`SHOW transaction_read_only`, the connection driven meanwhile).
async fn session_attrs(
    config: &Config,
    client: &Client,
    connection: &mut PgConnection,
) -> Result<(), String> {
    let wanted = config.get_target_session_attrs();
    if wanted == TargetSessionAttrs::Any {
        return Ok(());
    }
    let query = client.simple_query("SHOW transaction_read_only");
    tokio::pin!(query);
    let messages = loop {
        tokio::select! {
            answered = &mut query => break answered.map_err(|e| describe(&e))?,
            message = futures_util::future::poll_fn(|cx| connection.poll_message(cx)) => match message {
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(describe(&error)),
                None => return Err("the server closed the connection".into()),
            },
        }
    };
    let read_only = messages.iter().find_map(|message| match message {
        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
        _ => None,
    });
    match (wanted, read_only.as_deref()) {
        (TargetSessionAttrs::ReadWrite, Some("on")) => {
            Err("error connecting to server: database does not allow writes".into())
        }
        (TargetSessionAttrs::ReadOnly, Some("off")) => {
            Err("error connecting to server: database is not read only".into())
        }
        _ => Ok(()),
    }
}

/// A tokio-postgres error with its server detail (the bare Display of a
/// server error is just "db error").
pub fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => match std::error::Error::source(error) {
            Some(source) => format!("{error}: {source}"),
            None => error.to_string(),
        },
    }
}
