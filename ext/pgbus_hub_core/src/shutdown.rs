//! One shutdown signal for a group of tasks (the hub's, a LISTEN engine's):
//! triggered once, seen by every task, at once or whenever it next looks.

use tokio::sync::watch;

/// Fires the signal. Dropping it without firing also ends every wait.
#[derive(Debug)]
pub struct ShutdownTrigger(watch::Sender<bool>);

/// What a task holds to learn that it should stop.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

pub fn shutdown() -> (ShutdownTrigger, Shutdown) {
    let (sender, receiver) = watch::channel(false);
    (ShutdownTrigger(sender), Shutdown(receiver))
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        self.0.send_replace(true);
    }

    pub fn is_triggered(&self) -> bool {
        *self.0.borrow()
    }
}

impl Shutdown {
    /// True once fired, or once its trigger is gone (as [`Shutdown::wait`] sees it).
    pub fn is_triggered(&self) -> bool {
        *self.0.borrow() || self.0.has_changed().is_err()
    }

    /// Returns once the signal fired (or its trigger is gone).
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|triggered| *triggered).await;
    }
}
