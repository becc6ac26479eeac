//! The engine's way up: connecting with backoff while answering commands,
//! the primary check, the re-LISTEN (with the handover's marker), and what
//! a new connection owes the subscribers (healthy, catch-up wakes).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{listen_sql, op, op_reason, Engine, OpError, BACKOFF_FIRST, BACKOFF_MAX, CLOSE_GRACE};
use super::{LISTEN_BATCH, OP_TIMEOUT, PROBE_TIMEOUT};
use crate::conninfo::{describe, Connected};
use crate::listener::{Backend, Event, ListenError};
use crate::protocol::key_channel;
use crate::shutdown::Shutdown;

impl<F: FnMut(Event) + Send + 'static> Engine<F> {
    pub(super) fn next_delay(&mut self) -> Duration {
        let step = self.backoff_step;
        self.backoff_step = self.backoff_step.saturating_add(1);
        backoff_delay(step)
    }

    /// Connect (retrying with backoff) while answering commands. None = stop.
    pub(super) async fn connect_phase(&mut self) -> Option<Connected> {
        loop {
            let delay = self.next_delay();
            let options = self.config.connection.clone();
            let attempt = async move {
                // Not even a zero sleep: tokio rounds a timer up to the next
                // millisecond, and every one of them is NOTIFYs lost.
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                options.connect().await
            };
            tokio::pin!(attempt);
            let mut shutdown = self.shutdown.clone();
            let outcome = loop {
                tokio::select! {
                    biased;
                    () = shutdown.wait() => return None,
                    command = self.commands.recv() => match command {
                        None => return None,
                        Some(command) => self.handle_down(command),
                    },
                    outcome = &mut attempt => break outcome,
                    // A connection given up is read on meanwhile: its backend
                    // may be alive and delivering what it owes.
                    message = self.handover.recv() => {
                        if let Some(super::Exit::Stop) = self.on_kept(message, None).await {
                            return None;
                        }
                    }
                }
            };
            let session = match outcome {
                Ok(session) => session,
                Err(error) => {
                    self.connect_failed(false, &error.0);
                    continue;
                }
            };
            match self.relisten(&session).await {
                Ok((backend, marker)) => {
                    self.up(backend);
                    if let Some(token) = marker {
                        self.handover.marker_committed(token);
                    }
                    if let Some(cut) = self.start_cut.take() {
                        self.handover.cut_committed(cut.token());
                    }
                    return Some(session);
                }
                Err(Up::Listen(OpError::Stopped)) => {
                    session.close(CLOSE_GRACE).await;
                    return None;
                }
                Err(Up::Check(recovery, reason)) => {
                    self.connect_failed(recovery, &reason);
                    session.close(CLOSE_GRACE).await;
                }
                Err(Up::Listen(error)) => {
                    let reason = format!("re-LISTEN failed: {}", op_reason(&error));
                    self.connect_failed(false, &reason);
                    session.close(CLOSE_GRACE).await;
                }
            }
        }
    }

    pub(super) fn connect_failed(&mut self, recovery: bool, reason: &str) {
        self.stats.connect_failures.fetch_add(1, Ordering::Relaxed);
        self.stats.set_last_error(reason);
        let message = format!(
            "pgbus-hub listener: {reason} — retrying (attempt {})",
            self.backoff_step
        );
        if recovery {
            self.config.log.error(message);
        } else {
            self.config.log.warn(message);
        }
    }

    pub(super) fn up(&mut self, backend: Backend) {
        let pid = backend.pid;
        self.stats.set_backend(Some(backend));
        self.live = self.channels.keys().cloned().collect();
        for (channel, reply) in std::mem::take(&mut self.pending) {
            if self.live.contains(&channel) {
                reply.send(Ok(()));
            } else {
                // Unreachable: unlisten answers the pending listens it cancels.
                reply.send(Err(ListenError::Withdrawn { channel }));
            }
        }
        let reconnected = self.ever_connected;
        if !reconnected {
            self.config.log.debug(format!(
                "pgbus-hub listener connected to {} (backend pid {pid})",
                self.config.connection
            ));
        }
        self.ever_connected = true;
        self.backoff_step = 0;
        self.set_healthy(true);
        if reconnected {
            self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
            let woken = self.catch_up();
            let payloads = if self.handover.keeping() {
                "the given-up connection is read on until the handover marker, so payloads \
                 NOTIFYed meanwhile are delivered if its backend is alive"
            } else {
                "payloads NOTIFYed while disconnected are lost"
            };
            self.config.log.info(format!(
                "pgbus-hub listener reconnected (backend pid {pid}, {} channels re-LISTENed, \
                 {woken} queues woken to re-read what was committed meanwhile; {payloads})",
                self.live.len()
            ));
        }
    }

    /// After a reconnect: a durable wake (no payload) owed to every queue in
    /// the listen set ([`Event::CatchUp`]), so every subscriber re-reads what
    /// was committed while nothing listened (a NOTIFY sent then reached
    /// nobody). Raw channels carry only payloads, which are gone: nothing
    /// there to re-read. Returns how many.
    pub(super) fn catch_up(&mut self) -> usize {
        let queues: Vec<Arc<str>> = self
            .channels
            .values()
            .filter(|queue| key_channel(queue).is_none())
            .cloned()
            .collect();
        let woken = queues.len();
        // Sent even when empty: it is also how the hub learns of the reconnect
        // (its `reconnect.pgbus_hub` event), subscribed queues or not.
        self.deliver(Event::CatchUp(queues));
        woken
    }

    /// A new connection's primary check and re-LISTEN in one round trip:
    /// both requests are sent before either is answered (tokio-postgres
    /// pipelines them), because NOTIFYs committed until the LISTEN commits
    /// reach nobody. On a standby the check's refusal is the error: the
    /// server answers the check first, and LISTEN fails there anyway
    /// ("cannot execute LISTEN during recovery"). A check failing while
    /// its LISTEN commits leaves a handover marker no one awaits: the kept
    /// connection ignores it (logged) and reads on to the next one's.
    async fn relisten(&mut self, session: &Connected) -> Result<(Backend, Option<String>), Up> {
        let (queries, marker) = self.relisten_queries();
        let check = async {
            check_primary(session)
                .await
                .map_err(|(recovery, reason)| Up::Check(recovery, reason))
        };
        let listen = async {
            listen_all(self.shutdown.clone(), session, &queries)
                .await
                .map_err(Up::Listen)
        };
        // try_join polls the check first: its error wins over the LISTEN's.
        let (backend, ()) = futures_util::future::try_join(check, listen).await?;
        Ok((backend, marker))
    }

    /// The whole listen set, the private channel, (when a given-up
    /// connection is kept) the handover marker and (for a start with a cut,
    /// until one commits) the cut's two NOTIFYs, in ONE transaction: the
    /// markers' queue position is where this connection's LISTENs took
    /// effect. Returns the queries with the handover marker's token.
    fn relisten_queries(&mut self) -> (Vec<String>, Option<String>) {
        let (private, marker) = self.handover.statements();
        let mut closing: String = private
            .iter()
            .map(|statement| format!("{statement};"))
            .collect();
        if let Some(cut) = &self.start_cut {
            closing.push_str(&self.handover.cut_sql(cut));
        }
        (self.first_transaction(&closing), marker)
    }

    /// The whole listen set LISTENed in ONE transaction, `closing` (the
    /// private channel's statements, each ending in `;`) and COMMIT after
    /// the last LISTEN: one simple query per LISTEN_BATCH channels, BEGIN
    /// before the first. A new serving connection and a standby both
    /// start so.
    pub(super) fn first_transaction(&self, closing: &str) -> Vec<String> {
        let channels: Vec<String> = self.channels.keys().cloned().collect();
        let mut queries: Vec<String> = channels
            .chunks(LISTEN_BATCH)
            .map(|chunk| listen_sql("LISTEN", chunk))
            .collect();
        if queries.is_empty() {
            queries.push(String::new());
        }
        queries[0].insert_str(0, "BEGIN;");
        if let Some(last) = queries.last_mut() {
            last.push_str(closing);
            last.push_str("COMMIT");
        }
        queries
    }
}

/// The wait before connect attempt `step` (0: at once) of the serving
/// connection or the standby, each counting its own.
pub(super) fn backoff_delay(step: u32) -> Duration {
    if step == 0 {
        return Duration::ZERO;
    }
    let base = BACKOFF_FIRST
        .saturating_mul(1u32 << (step - 1).min(16))
        .min(BACKOFF_MAX);
    // +-20% jitter so a host's listeners do not retry in lockstep.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let factor = 0.8 + f64::from(nanos % 1000) / 2500.0;
    base.mul_f64(factor)
}

/// Why a new connection was not brought up.
enum Up {
    /// The primary check's refusal or failure, and whether it was a server in recovery.
    Check(bool, String),
    Listen(OpError),
}

/// The re-LISTEN's queries, in order (see [`Engine::relisten_queries`]).
pub(super) async fn listen_all(
    shutdown: Shutdown,
    session: &Connected,
    queries: &[String],
) -> Result<(), OpError> {
    for sql in queries {
        op(
            shutdown.clone(),
            session.client.batch_execute(sql),
            OP_TIMEOUT,
        )
        .await?;
    }
    Ok(())
}

/// The backend (pid, database, client address), and a refusal if the server
/// is a standby (NOTIFY is never delivered on a hot standby: LISTEN there
/// would wait forever).
pub(super) async fn check_primary(session: &Connected) -> Result<Backend, (bool, String)> {
    let query = session.client.simple_query(
        "SELECT pg_backend_pid()::text, pg_is_in_recovery()::text, current_database(), \
         inet_client_addr()::text",
    );
    let messages = match tokio::time::timeout(PROBE_TIMEOUT, query).await {
        Ok(Ok(messages)) => messages,
        Ok(Err(error)) => {
            return Err((false, format!("primary check failed: {}", describe(&error))))
        }
        Err(_) => return Err((false, "primary check got no answer in time".into())),
    };
    let row = messages.iter().find_map(|message| match message {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    });
    let Some(row) = row else {
        return Err((false, "primary check returned no row".into()));
    };
    let pid = row
        .get(0)
        .and_then(|pid| pid.parse::<u32>().ok())
        .unwrap_or(0);
    // `::text` of a boolean is "true"/"false" (the bare column would be "t").
    if row.get(1) == Some("true") {
        return Err((
            true,
            "refusing to LISTEN on a server in recovery (a hot standby never delivers NOTIFY); \
             point the listener at the primary"
                .into(),
        ));
    }
    Ok(Backend {
        pid,
        database: row.get(2).unwrap_or_default().to_owned(),
        client_addr: row.get(3).map(str::to_owned),
    })
}
