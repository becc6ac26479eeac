//! The one way an object of this crate runs a thread of its own (the hub's
//! runtime, a fallback listener's engine, a fail-over listener's LISTEN and
//! fail-back threads), with the rules every such thread follows:
//! - [`OwnedThread::stop_or_cancel`] tells it to stop, then waits for it to
//!   end, bounded, and gives the wait up as soon as `cancel` receives (an
//!   embedder's unblock function);
//! - dropping it only tells it to stop: the thread ends on its own, detached,
//!   so a drop (a Ruby object's GC free) never waits for it;
//! - in a forked child it is inert: the thread does not exist there, and its
//!   stop signal or exit channel would reach the parent's through memory and
//!   descriptors the child only inherited.

use std::mem::ManuallyDrop;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Receiver;

use crate::process::Owner;

type StopSignal = Box<dyn FnOnce() + Send>;

pub struct OwnedThread {
    owner: Owner,
    /// Taken when the thread is told to stop (once).
    signal: Option<StopSignal>,
    /// ManuallyDrop: never dropped in a forked child (see Drop).
    thread: ManuallyDrop<Option<JoinHandle<()>>>,
    /// Disconnects when the thread's body has returned.
    exited: ManuallyDrop<Receiver<()>>,
}

/// How [`OwnedThread::stop_or_cancel`]'s wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The thread ended and was joined.
    Joined,
    /// `cancel` received first: the thread, told to stop, ends detached.
    Cancelled,
    /// The bound passed first: the thread, told to stop, ends detached.
    TimedOut,
    /// Nothing to wait for here: a forked child's copy.
    NotOurs,
}

impl OwnedThread {
    /// Starts `body` on a thread called `name`; `signal` is how it is told to
    /// stop (called at most once, in the creating process only).
    pub fn spawn(
        name: &str,
        signal: impl FnOnce() + Send + 'static,
        body: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Self> {
        let (exiting, exited) = crossbeam_channel::bounded::<()>(0);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _exiting = exiting;
                body();
            })?;
        Ok(Self {
            owner: Owner::current(),
            signal: Some(Box::new(signal)),
            thread: ManuallyDrop::new(Some(thread)),
            exited: ManuallyDrop::new(exited),
        })
    }

    /// [`OwnedThread::spawn`] for a body that waits on a channel of its own:
    /// `body` gets a receiver that disconnects when the thread is told to stop.
    pub fn spawn_with_stop_channel(
        name: &str,
        body: impl FnOnce(&Receiver<()>) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        Self::spawn(name, move || drop(stop), move || body(&stopped))
    }

    /// True while the thread runs, in the process that started it.
    pub fn is_running(&self) -> bool {
        self.owner.is_current() && self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Tells the thread to stop (idempotent; nothing in a forked child).
    pub fn signal(&mut self) {
        if self.owner.is_current() {
            if let Some(signal) = self.signal.take() {
                signal();
            }
        }
    }

    /// Tells the thread to stop, then waits for it to end within `within`
    /// (None: no bound) unless `cancel` receives first.
    pub fn stop_or_cancel(mut self, cancel: &Receiver<()>, within: Option<Duration>) -> Stopped {
        if !self.owner.is_current() {
            return Stopped::NotOurs;
        }
        self.signal();
        let bound = within.map_or_else(crossbeam_channel::never, crossbeam_channel::after);
        crossbeam_channel::select! {
            // Disconnected: the body returned.
            recv(self.exited) -> _ => {
                if let Some(thread) = self.thread.take() {
                    let _ = thread.join();
                }
                Stopped::Joined
            }
            recv(cancel) -> _ => Stopped::Cancelled,
            recv(bound) -> _ => Stopped::TimedOut,
        }
    }
}

impl Drop for OwnedThread {
    fn drop(&mut self) {
        if self.owner.is_current() {
            self.signal();
            // SAFETY: each field is dropped once, here, and never used again.
            // The JoinHandle's drop detaches the thread: nothing waits.
            unsafe {
                ManuallyDrop::drop(&mut self.thread);
                ManuallyDrop::drop(&mut self.exited);
            }
        } else if let Some(signal) = self.signal.take() {
            // A forked child: the signal would write to the parent's runtime
            // through inherited descriptors, detaching would name a thread
            // that does not exist here, and the exit channel's lock may have
            // been held by a parent thread at fork time. Leak all three.
            std::mem::forget(signal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::RecvTimeoutError;

    /// Generous: only a thread that never ends waits this long.
    const ENDS_WITHIN: Duration = Duration::from_secs(30);

    /// A thread that ends only when told to stop, then takes `linger` to
    /// finish; the receiver disconnects once it has.
    fn lingering(linger: Duration) -> (OwnedThread, Receiver<()>) {
        let (finishing, finished) = crossbeam_channel::bounded::<()>(0);
        let thread = OwnedThread::spawn_with_stop_channel("owned-thread-test", move |stopped| {
            let _finishing = finishing;
            let _ = stopped.recv();
            std::thread::sleep(linger);
        })
        .unwrap();
        (thread, finished)
    }

    fn has_ended(finished: &Receiver<()>, within: Duration) -> bool {
        finished.recv_timeout(within) == Err(RecvTimeoutError::Disconnected)
    }

    #[test]
    fn stop_joins_the_thread() {
        let (thread, finished) = lingering(Duration::from_millis(20));
        assert!(thread.is_running());
        let outcome = thread.stop_or_cancel(&crossbeam_channel::never(), None);
        assert_eq!(outcome, Stopped::Joined);
        assert!(has_ended(&finished, Duration::ZERO));
    }

    #[test]
    fn a_bound_or_a_cancel_gives_the_wait_up_and_the_thread_still_ends() {
        let (thread, finished) = lingering(Duration::from_millis(300));
        let bound = Some(Duration::from_millis(10));
        assert_eq!(
            thread.stop_or_cancel(&crossbeam_channel::never(), bound),
            Stopped::TimedOut
        );
        assert!(has_ended(&finished, ENDS_WITHIN));

        let (thread, finished) = lingering(Duration::from_millis(300));
        let (cancel, cancelled) = crossbeam_channel::bounded(1);
        cancel.send(()).unwrap();
        assert_eq!(thread.stop_or_cancel(&cancelled, None), Stopped::Cancelled);
        assert!(has_ended(&finished, ENDS_WITHIN));
    }

    #[test]
    fn a_drop_signals_without_waiting() {
        let (thread, finished) = lingering(Duration::from_secs(1));
        drop(thread);
        // Still lingering: the drop did not wait for it ...
        assert!(!has_ended(&finished, Duration::ZERO));
        // ... and it was told to stop.
        assert!(has_ended(&finished, ENDS_WITHIN));
    }
}
