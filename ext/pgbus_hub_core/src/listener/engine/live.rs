//! The engine's LISTEN and UNLISTEN on a live connection: requests batched
//! into one round trip, a refused name answered alone, the set kept in step.

use super::{exit_for, listen_sql, op, op_reason, Engine, Exit, OpError, LISTEN_BATCH};
use crate::conninfo::{describe, Connected};
use crate::listener::{Command, Event, ListenError, Reply};

impl<F: FnMut(Event) + Send + 'static> Engine<F> {
    /// LISTEN this request plus every listen already queued behind it, in one
    /// round trip. Returns an exit if the connection broke or stop was called.
    pub(super) async fn listen_live(
        &mut self,
        session: &Connected,
        queue: String,
        reply: Reply,
    ) -> Option<Exit> {
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
        let exit = self.run_listens(session, batch).await;
        if exit.is_some() {
            if let Some(command) = deferred {
                // The connection is gone: handle it as while down.
                self.handle_down(command);
            }
            return exit;
        }
        match deferred {
            None => None,
            Some(Command::Unlisten { queue }) => self.unlisten_live(session, &queue).await,
            Some(listen @ Command::Listen { .. }) => {
                // Unreachable (listens are batched), handled for completeness.
                self.handle_down(listen);
                None
            }
        }
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
                for (channel, reply) in batch {
                    self.live.insert(channel);
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

    pub(super) async fn unlisten_live(&mut self, session: &Connected, queue: &str) -> Option<Exit> {
        let channel = self.forget(queue)?;
        let sql = listen_sql("UNLISTEN", &[channel]);
        let deadline = self.live_op_timeout();
        match op(
            self.shutdown.clone(),
            session.client.batch_execute(&sql),
            deadline,
        )
        .await
        {
            Ok(()) => None,
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
fn refused_by_server(error: &tokio_postgres::Error, session: &Connected) -> bool {
    !session.client.is_closed()
        && error
            .as_db_error()
            .is_some_and(|db| db.severity() == "ERROR")
}
