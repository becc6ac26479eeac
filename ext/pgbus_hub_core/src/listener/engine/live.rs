//! The engine's commands on a live connection: LISTEN and UNLISTEN (requests
//! batched into one round trip, a refused name answered alone, the set kept
//! in step), and cuts (batched into one transaction).

use super::{exit_for, listen_sql, op, op_reason, Engine, Exit, OpError, LISTEN_BATCH};
use crate::conninfo::{describe, Connected};
use crate::listener::{Command, Cut, CutError, Event, ListenError, Reply};

/// Cuts per transaction: two NOTIFYs each, as many statements as a LISTEN batch.
const CUT_BATCH: usize = LISTEN_BATCH / 2;

impl<F: FnMut(Event) + Send + 'static> Engine<F> {
    /// One command on the live connection, with those queued behind it that
    /// batch with it; the first that does not runs next. Returns an exit if
    /// the connection broke or stop was called (a command not run yet is
    /// then handled as while down).
    pub(super) async fn live_command(
        &mut self,
        session: &Connected,
        command: Command,
    ) -> Option<Exit> {
        let mut next = Some(command);
        while let Some(command) = next.take() {
            let (exit, deferred) = match command {
                Command::Listen { queue, reply } => self.listen_live(session, queue, reply).await,
                Command::Unlisten { queue } => (self.unlisten_live(session, &queue).await, None),
                Command::Cut { cut, reply } => self.cut_live(session, cut, reply).await,
                stop_at @ Command::StopAt(_) => {
                    self.handle_down(stop_at);
                    (None, None)
                }
            };
            if exit.is_some() {
                if let Some(command) = deferred {
                    self.handle_down(command);
                }
                return exit;
            }
            next = deferred;
        }
        None
    }

    /// LISTEN this request plus every listen already queued behind it, in one
    /// round trip. Returns an exit if the connection broke or stop was
    /// called, and the first command of another kind, to run next.
    async fn listen_live(
        &mut self,
        session: &Connected,
        queue: String,
        reply: Reply,
    ) -> (Option<Exit>, Option<Command>) {
        let mut batch: Vec<(String, Reply)> = Vec::new();
        let mut next = Some(Command::Listen { queue, reply });
        let mut deferred = None;
        while let Some(command) = next.take() {
            match command {
                Command::Listen { queue, reply } => {
                    if let Some((channel, reply)) = self.admit(&queue, reply) {
                        if self.live.contains(&channel) {
                            reply.send(Ok(()));
                        } else {
                            batch.push((channel, reply));
                        }
                    }
                    if batch.len() < LISTEN_BATCH {
                        next = self.commands.try_recv().ok();
                    }
                }
                other => deferred = Some(other),
            }
        }
        (self.run_listens(session, batch).await, deferred)
    }

    /// Commit this cut plus every cut already queued behind it in ONE
    /// transaction (docs/architecture.md, "The cut"): for each, `NOTIFY
    /// <other side>, K; NOTIFY <ours>, K`. Its entries sit together in the
    /// queue, so each cut's two markers are at one position among the
    /// notifications. No BEGIN: a multi-statement query is one implicit
    /// transaction, and one the server refuses leaves no block open.
    async fn cut_live(
        &mut self,
        session: &Connected,
        cut: Cut,
        reply: Reply<CutError>,
    ) -> (Option<Exit>, Option<Command>) {
        let mut batch = vec![(cut, reply)];
        let mut deferred = None;
        while batch.len() < CUT_BATCH {
            match self.commands.try_recv() {
                Ok(Command::Cut { cut, reply }) => batch.push((cut, reply)),
                Ok(other) => {
                    deferred = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        let sql: String = batch
            .iter()
            .map(|(cut, _)| self.handover.cut_sql(cut))
            .collect();
        let deadline = self.live_op_timeout();
        let outcome = op(
            self.shutdown.clone(),
            session.client.batch_execute(&sql),
            deadline,
        )
        .await;
        let (answer, exit) = match outcome {
            Ok(()) => (Ok(()), None),
            Err(OpError::Stopped) => (Err(CutError::Stopped), Some(Exit::Stop)),
            Err(OpError::Pg(error)) if refused_by_server(&error, session) => {
                let reason = describe(&error);
                self.config.log.warn(format!(
                    "pgbus-hub listener: {} cut(s) refused by the server: {reason}",
                    batch.len()
                ));
                (Err(CutError::Failed(reason)), None)
            }
            Err(error) => {
                let reason = format!(
                    "committing {} cut(s) failed: {} (deadline {deadline:?})",
                    batch.len(),
                    op_reason(&error)
                );
                (
                    Err(CutError::Failed(reason.clone())),
                    Some(exit_for(&error, reason)),
                )
            }
        };
        for (_, reply) in batch {
            reply.send(answer.clone());
        }
        (exit, deferred)
    }

    async fn run_listens(
        &mut self,
        session: &Connected,
        mut batch: Vec<(String, Reply)>,
    ) -> Option<Exit> {
        if batch.is_empty() {
            return None;
        }
        let mut channels: Vec<String> = batch.iter().map(|(c, _)| c.clone()).collect();
        channels.dedup();
        let sql = listen_sql("LISTEN", &channels);
        let deadline = self.live_op_timeout();
        match op(
            self.shutdown.clone(),
            session.client.batch_execute(&sql),
            deadline,
        )
        .await
        {
            Ok(()) => {
                for (channel, _) in &batch {
                    self.live.insert(channel.clone());
                }
                // The ack after both connections' LISTENs ran.
                self.realign_standby().await;
                for (_, reply) in batch {
                    reply.send(Ok(()));
                }
                None
            }
            Err(OpError::Pg(error)) if refused_by_server(&error, session) => {
                // A multi-statement query is one implicit transaction: nothing
                // was LISTENed. Retry one by one to refuse only the bad ones.
                if batch.len() == 1 {
                    if let Some((channel, reply)) = batch.pop() {
                        let reason = describe(&error);
                        self.config.log.warn(format!(
                            "pgbus-hub listener: LISTEN {channel:?} refused: {reason}"
                        ));
                        if let Some(queue) = self.channels.get(&channel).cloned() {
                            self.forget(&queue);
                        }
                        reply.send(Err(ListenError::Failed { channel, reason }));
                    }
                    return None;
                }
                for entry in batch {
                    if let Some(exit) = Box::pin(self.run_listens(session, vec![entry])).await {
                        return Some(exit);
                    }
                }
                None
            }
            Err(OpError::Stopped) => {
                for (_, reply) in batch {
                    reply.send(Err(ListenError::Stopped));
                }
                Some(Exit::Stop)
            }
            Err(error) => {
                // The connection broke, or did not answer within the deadline:
                // these wait for reconnect + re-LISTEN.
                self.pending.extend(batch);
                let reason = format!(
                    "LISTEN failed: {} (deadline {deadline:?})",
                    op_reason(&error)
                );
                Some(exit_for(&error, reason))
            }
        }
    }

    async fn unlisten_live(&mut self, session: &Connected, queue: &str) -> Option<Exit> {
        let channel = self.forget(queue)?;
        if self.defers_unlisten() {
            // Run when this connection reads the marker of the change.
            self.deferred.insert(channel);
            self.realign_standby().await;
            return None;
        }
        let sql = listen_sql("UNLISTEN", &[channel]);
        let deadline = self.live_op_timeout();
        match op(
            self.shutdown.clone(),
            session.client.batch_execute(&sql),
            deadline,
        )
        .await
        {
            Ok(()) => {
                self.realign_standby().await;
                None
            }
            Err(OpError::Stopped) => Some(Exit::Stop),
            // The channel is out of the set either way (a NOTIFY on it is ignored).
            Err(OpError::Pg(error)) if refused_by_server(&error, session) => {
                self.config.log.warn(format!(
                    "pgbus-hub listener: UNLISTEN for {queue:?} refused: {}",
                    describe(&error)
                ));
                None
            }
            Err(error) => {
                let reason = format!(
                    "UNLISTEN failed: {} (deadline {deadline:?})",
                    op_reason(&error)
                );
                Some(exit_for(&error, reason))
            }
        }
    }
}

/// A server-side ERROR on a connection that is still usable (as opposed to a
/// FATAL, an I/O error or a closed connection).
pub(super) fn refused_by_server(error: &tokio_postgres::Error, session: &Connected) -> bool {
    !session.client.is_closed()
        && error
            .as_db_error()
            .is_some_and(|db| db.severity() == "ERROR")
}
