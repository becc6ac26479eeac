//! The Ruby threads of a native object (MasterHub, HubClient,
//! FailoverListener): a log thread handing records to the `logger:` option
//! and, when there is a `dispatch_queue:`, a pump handing it the wakes. Each
//! is a Ruby thread looping on one native call that waits without the GVL
//! ([`Outputs::drain_logs`], [`Outputs::pump_wakes`]), kept in the object's
//! `@log_thread` / `@pump` (GC-visible, and the thread holds the object as
//! its argument). `stop` closes the native side, then joins them (bounded) in
//! the creating process only: a forked child never touches its parent's threads.

use crate::pump::Outputs;
use magnus::{block::Proc, prelude::*, typed_data::Obj, Error, RArray, Ruby, Value};

/// How long `stop` waits for each thread once its stream is closed: a
/// delivery under way (a slow `<<` or logger) finishes, but a wedged one
/// never holds up the caller's shutdown (Puma's stop, a worker's exit).
const JOIN_SECONDS: f64 = 5.0;

/// Where `start` keeps the threads; `alive` reads them (the alive ones: none
/// once `stop` joined them).
const THREAD_IVARS: [&str; 2] = ["@pump", "@log_thread"];

/// A native class with Ruby threads: they drain its [`Outputs`], and its
/// `stop` is its native stop, then joining them.
pub trait NativeObject: magnus::TypedData {
    /// Idempotent; stops the native side (`stop` then closes the outputs).
    fn native_stop(ruby: &Ruby, rb_self: &Self) -> Result<(), Error>;

    fn outputs(&self) -> &Outputs;
}

/// Called by the native start/connect once it succeeded.
pub fn start<T: NativeObject>(ruby: &Ruby, owner: Obj<T>, name: &str) -> Result<(), Error> {
    let targets = owner.outputs().targets();
    if let Some(logger) = targets.logger.map(|logger| ruby.get_inner(logger)) {
        let body = ruby.proc_new(drain_logs::<T>);
        let thread = spawn(ruby, format!("{name} log"), (owner, logger), body)?;
        owner.ivar_set("@log_thread", thread)?;
    }
    if targets.dispatch_queue.is_some() {
        let thread = spawn(
            ruby,
            format!("{name} pump"),
            (owner,),
            ruby.proc_new(pump::<T>),
        )?;
        owner.ivar_set("@pump", thread)?;
    }
    Ok(())
}

/// A named Ruby thread running `body` with `args`. Not reported when it ends
/// by an exception: the loops log what they survive, and what ends them
/// (Thread#kill, an interrupt at exit) is expected.
fn spawn(
    ruby: &Ruby,
    name: String,
    args: impl magnus::ArgList,
    body: Proc,
) -> Result<Value, Error> {
    let thread: Value = ruby.class_thread().funcall_with_block("new", args, body)?;
    let _: Value = thread.funcall("report_on_exception=", (false,))?;
    let _: Value = thread.funcall("name=", (name,))?;
    // Puma 7+ warns about threads started during app boot unless fork_safe.
    let _: Value = thread.funcall("thread_variable_set", (ruby.to_symbol("fork_safe"), true))?;
    Ok(thread)
}

/// The pump thread's body (`Thread.new(owner)`).
fn pump<T: NativeObject>(ruby: &Ruby, args: &[Value], _block: Option<Proc>) -> Result<(), Error> {
    let owner = Obj::<T>::try_convert(args[0])?;
    while owner.outputs().pump_wakes(ruby)? {}
    Ok(())
}

/// The log thread's body (`Thread.new(owner, logger)`).
fn drain_logs<T: NativeObject>(
    ruby: &Ruby,
    args: &[Value],
    _block: Option<Proc>,
) -> Result<(), Error> {
    let owner = Obj::<T>::try_convert(args[0])?;
    while owner.outputs().drain_logs(ruby, args[1])? {}
    Ok(())
}

/// `#threads`: the object's threads still alive.
pub fn alive<T: NativeObject>(ruby: &Ruby, owner: Obj<T>) -> Result<RArray, Error> {
    let alive = ruby.ary_new();
    for ivar in THREAD_IVARS {
        let thread: Value = owner.ivar_get(ivar)?;
        if !thread.is_nil() && thread.funcall("alive?", ())? {
            alive.push(thread)?;
        }
    }
    Ok(alive)
}

/// `#stop`: bounded; returns the object. Also from one of its own threads
/// (an `on_failure` or `<<` that stops the object): that one is not joined
/// (a thread cannot join itself) and ends when its call returns.
pub fn stop<T: NativeObject>(ruby: &Ruby, rb_self: Obj<T>) -> Result<Obj<T>, Error> {
    let stopped = T::native_stop(ruby, &rb_self);
    // Closed whatever the native stop returned: the threads' next calls return false.
    rb_self.outputs().close();
    stopped?;
    if rb_self.outputs().in_owner_process() {
        let current = ruby.thread_current();
        for thread in alive(ruby, rb_self)? {
            if !thread.equal(current)? {
                let _: Value = thread.funcall("join", (JOIN_SECONDS,))?;
            }
        }
    }
    // The references stay: a thread that outlived its join is still listed
    // by `#threads` (pgbus 0.15+'s shutdown reports such leaks by name).
    Ok(rb_self)
}
