//! A planned stop hands every worker over before the hub's LISTEN connection
//! closes (docs/architecture.md, "1. A planned hub stop"): each worker gets
//! `move` with a cut token K; ours answer, start their own LISTEN connection
//! whose first transaction also NOTIFYs K on the hub's private channel, and
//! the hub, reading K in stream order, sends that worker `marker` and routes
//! it nothing more. The worker reads the hub up to the `marker` and its own
//! connection from K on: nothing lost, nothing twice, order kept.
//!
//! A peer that does not answer (pgbus's Ruby client, an older pgbus-hub
//! worker) is closed after [`MOVE_ANSWER_GRACE`] and fails over as before;
//! whatever has not moved by [`MOVE_DEADLINE`] is closed too. Without a
//! LISTEN connection (the database down) no marker can come: every worker
//! is closed at once, as before.

use super::super::command::Command;
use super::super::supervisor::FromEngine;
use super::super::worker_connection::WorkerId;
use super::{Inputs, Router};
use crate::listener::{cut_token, Event};
use crate::protocol::{Marker, Message, Move};
use crate::shutdown::Shutdown;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a worker has to answer `move`: ours answer within milliseconds
/// (the pump thread reads the frame); a peer that has not answered by then
/// never will.
pub const MOVE_ANSWER_GRACE: Duration = Duration::from_secs(1);

/// How long a stop waits for the workers' markers: as long as the LISTEN
/// engine gives a re-LISTEN (its `OP_TIMEOUT`), since a worker's first
/// transaction is one.
pub const MOVE_DEADLINE: Duration = Duration::from_secs(5);

/// One worker asked to move.
struct Moving {
    token: String,
    answered: bool,
    /// Its `marker` was queued: it is the worker's own connection's from here.
    marked: bool,
}

/// How the hand-over went, for the stop's log line and the stats.
#[derive(Default)]
struct Tally {
    moved: u64,
    unmoved: u64,
}

impl Router {
    /// The stop's hand-over: returns once every worker asked has moved or
    /// been closed, at [`MOVE_DEADLINE`], or as soon as `hurry` fires (a
    /// second signal, an embedder's unblock): the caller then closes the rest.
    pub(super) async fn hand_over(&mut self, inputs: &mut Inputs, mut hurry: Shutdown) {
        let began = Instant::now();
        for id in std::mem::take(&mut self.monitors) {
            if let Some(monitor) = self.workers.remove(&id) {
                monitor.close();
            }
        }
        let channel = self
            .engine
            .stats()
            .filter(|_| self.shared.healthy.load(Ordering::Relaxed))
            .and_then(|stats| stats.private_channel());
        let Some(channel) = channel.filter(|_| !hurry.is_triggered()) else {
            if !self.workers.is_empty() && !hurry.is_triggered() {
                self.shared.log.warn(format!(
                    "closing {} worker connection(s) without handing them over: the LISTEN \
                     connection is down, so no marker can align them (they fail over)",
                    self.workers.len()
                ));
            }
            return;
        };
        let mut moving: HashMap<WorkerId, Moving> = HashMap::new();
        for (id, worker) in &self.workers {
            let token = cut_token();
            let leave = Move::Leave {
                channel: channel.clone(),
                token: token.clone(),
                to: None,
            };
            self.send(worker, &Message::Move(leave));
            moving.insert(
                *id,
                Moving {
                    token,
                    answered: false,
                    marked: false,
                },
            );
        }
        let asked = moving.len();
        let mut tally = Tally::default();
        let grace = tokio::time::sleep(MOVE_ANSWER_GRACE);
        let deadline = tokio::time::sleep(MOVE_DEADLINE);
        tokio::pin!(grace, deadline);
        let mut graced = false;
        while !moving.is_empty() {
            tokio::select! {
                _ = hurry.wait() => break,
                () = &mut deadline => break,
                () = &mut grace, if !graced => {
                    graced = true;
                    let silent: Vec<WorkerId> = moving
                        .iter()
                        .filter(|(_, m)| !m.answered)
                        .map(|(id, _)| *id)
                        .collect();
                    for id in silent {
                        self.close_unmoved(id, &mut moving, &mut tally, "it did not answer move");
                    }
                }
                Some(signal) = inputs.from_engine.recv() => match signal {
                    FromEngine::Event(Event::Marker(token)) => self.marker_read(&token, &mut moving),
                    FromEngine::Event(event) => self.on_event(event),
                    FromEngine::Listened { id, outcome } => {
                        self.listened(id, outcome);
                        self.publish_counts();
                    }
                },
                Some(command) = inputs.commands.recv() => match command {
                    Command::MoveAnswer { worker, token } => {
                        if let Some(m) = moving.get_mut(&worker).filter(|m| m.token == token) {
                            m.answered = true;
                        }
                    }
                    Command::Gone(worker) => {
                        if let Some(gone) = moving.remove(&worker) {
                            if gone.marked {
                                tally.moved += 1;
                            } else {
                                tally.unmoved += 1;
                            }
                        }
                        self.on_command(Command::Gone(worker));
                    }
                    command => self.on_command(command),
                },
            }
        }
        let left: Vec<WorkerId> = moving.keys().copied().collect();
        for id in left {
            let why = if hurry.is_triggered() {
                "the stop was cut short"
            } else {
                "no marker by the deadline"
            };
            self.close_unmoved(id, &mut moving, &mut tally, why);
        }
        let shared = &self.shared;
        shared
            .moved_workers
            .fetch_add(tally.moved, Ordering::Relaxed);
        shared
            .unmoved_workers
            .fetch_add(tally.unmoved, Ordering::Relaxed);
        if asked > 0 {
            shared.log.info(format!(
                "handed {} worker(s) over at their markers in {:.3} s ({} closed without a marker)",
                tally.moved,
                began.elapsed().as_secs_f64(),
                tally.unmoved
            ));
        }
    }

    /// The hub read `token` on its private channel: the worker it was made
    /// for gets `marker` behind everything queued for it (catch-up owed
    /// included), and nothing more is routed to it.
    fn marker_read(&mut self, token: &str, moving: &mut HashMap<WorkerId, Moving>) {
        let Some((id, m)) = moving.iter_mut().find(|(_, m)| m.token == token) else {
            return self.on_event(Event::Marker(token.to_owned()));
        };
        let id = *id;
        m.marked = true;
        if let Some(worker) = self.workers.get(&id).cloned() {
            worker.settle_catch_up();
            let read = Marker::Read {
                token: token.to_owned(),
            };
            self.send(&worker, &Message::Marker(read));
        }
        for queue in self.registry.remove_worker(id) {
            self.engine.unlisten(&queue);
        }
    }

    /// Closes a worker that did not move: it fails over as before a planned stop was one.
    fn close_unmoved(
        &mut self,
        id: WorkerId,
        moving: &mut HashMap<WorkerId, Moving>,
        tally: &mut Tally,
        why: &str,
    ) {
        let Some(gone) = moving.remove(&id) else {
            return;
        };
        if gone.marked {
            // Its marker is queued: it moves once it reads it; the close only ends the wait.
            tally.moved += 1;
            return;
        }
        tally.unmoved += 1;
        if let Some(worker) = self.workers.get(&id) {
            self.shared.log.info(format!(
                "closing {} without a hand-over: {why} (it fails over)",
                worker.label()
            ));
            worker.close();
        }
    }
}
