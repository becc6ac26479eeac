//! The thread behind `listen_async`.

use super::*;

/// The `listen_async` thread: commands in order; a LISTEN not confirmed is
/// asked again after [`LISTEN_RETRY`] while still subscribed (logged once
/// per queue). Ends at `stop`, or once the listener is gone.
pub(super) fn run_async_listens(
    shared: &Weak<FailoverShared>,
    commands: &Receiver<Command>,
    stop: &Receiver<()>,
) {
    let mut retries: VecDeque<(Instant, String, u64)> = VecDeque::new();
    let mut retrying: HashSet<String> = HashSet::new();
    loop {
        let wait = retries.front().map_or(Duration::MAX, |(at, ..)| {
            at.saturating_duration_since(Instant::now())
        });
        let (command, retry) = crossbeam_channel::select! {
            recv(stop) -> _ => return,
            recv(commands) -> command => match command {
                Ok(command) => (command, false),
                Err(_) => return,
            },
            default(wait) => match retries.pop_front() {
                Some((_, queue, ticket)) => (Command::Listen(queue, ticket), true),
                None => continue,
            },
        };
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let listener = FailoverListener { shared };
        let (queue, ticket) = match command {
            Command::Unlisten(queue) => {
                listener.remove_listening(&queue);
                continue;
            }
            Command::Listen(queue, _) if retry && !listener.subscribed(&queue) => {
                retrying.remove(&queue); // unsubscribed since
                continue;
            }
            Command::Listen(queue, ticket) => (queue, ticket),
        };
        match listener.ensure_listening_or_cancel(&queue, stop) {
            Listened::Done => {
                retrying.remove(&queue);
                let _ = listener
                    .shared
                    .local_wakes
                    .send(Delivery::Listening { queue, ticket });
                if let Some(reader) = lock(&listener.shared.hub_reader).clone() {
                    reader.interrupt(); // the pump waits on the hub's socket
                }
            }
            Listened::NotConfirmed if lock(&listener.shared.state).stopped => return,
            Listened::NotConfirmed => {
                if retrying.insert(queue.clone()) {
                    listener.shared.log.warn(format!(
                        "[pgbus-hub] LISTEN {queue:?} not confirmed: asking again every {}s while subscribed",
                        LISTEN_RETRY.as_secs_f64()
                    ));
                }
                retries.push_back((Instant::now() + LISTEN_RETRY, queue, ticket));
            }
            Listened::Refused(_) => {} // logged by ensure_listening
        }
    }
}
