//! Fork awareness. Puma forks workers from the process that owns a hub or a
//! client; a forked child inherits our file descriptors and memory but none of
//! our threads. Objects remember the pid that created them and become inert
//! (no join, no close, no write, no unlink) anywhere else.

/// The calling process's pid (not cached: a cached value would be the parent's after fork).
pub fn current_pid() -> u32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() as u32 }
}

/// The pid an object was created in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner(u32);

impl Owner {
    pub fn current() -> Self {
        Self(current_pid())
    }

    /// True in the creating process, false in a forked child.
    pub fn is_current(self) -> bool {
        self.0 == current_pid()
    }

    pub fn pid(self) -> u32 {
        self.0
    }
}
