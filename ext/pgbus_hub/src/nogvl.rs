//! Running blocking native code without the GVL, so other Ruby threads keep
//! running; `unblock` is how Ruby interrupts it (Thread#kill, Thread#raise,
//! process shutdown): it must make `func` return promptly.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use magnus::{Error, Ruby};

struct Call<F, R> {
    func: Option<F>,
    result: Option<std::thread::Result<R>>,
}

unsafe extern "C" fn trampoline<F: FnOnce() -> R, R>(data: *mut c_void) -> *mut c_void {
    // SAFETY: `data` is the `Call` on `nogvl`'s stack, alive for the whole call.
    run(unsafe { &mut *(data as *mut Call<F, R>) });
    std::ptr::null_mut()
}

fn run<F: FnOnce() -> R, R>(call: &mut Call<F, R>) {
    if let Some(func) = call.func.take() {
        // A panic must not unwind into Ruby's C frames.
        call.result = Some(catch_unwind(AssertUnwindSafe(func)));
    }
}

unsafe extern "C" fn unblock_trampoline<U: Fn()>(data: *mut c_void) {
    // SAFETY: `data` is the `U` on `nogvl`'s stack, alive for the whole call.
    let unblock = unsafe { &*(data as *const U) };
    let _ = catch_unwind(AssertUnwindSafe(unblock));
}

/// Runs `call` with the GVL released. `unwinds`: Ruby acts on an interrupt
/// inside the call (`rb_thread_call_without_gvl`: Thread#kill unwinds out of
/// it, or skips it when already pending); otherwise only after the native
/// method returns (`rb_thread_call_without_gvl2`: `call` is left unrun if an
/// interrupt was already pending).
fn without_gvl<F: FnOnce() -> R, R, U: Fn()>(call: &mut Call<F, R>, unblock: &U, unwinds: bool) {
    let data = call as *mut Call<F, R> as *mut c_void;
    let unblock_data = unblock as *const U as *mut c_void;
    // SAFETY: both pointers outlive the call; the trampolines match their data types.
    unsafe {
        if unwinds {
            rb_sys::rb_thread_call_without_gvl(
                Some(trampoline::<F, R>),
                data,
                Some(unblock_trampoline::<U>),
                unblock_data,
            );
        } else {
            rb_sys::rb_thread_call_without_gvl2(
                Some(trampoline::<F, R>),
                data,
                Some(unblock_trampoline::<U>),
                unblock_data,
            );
        }
    }
}

/// Calls `func` with the GVL released. `func` must not touch any Ruby object.
/// Returns None if `func` panicked (the caller raises).
pub fn nogvl<F, R, U>(func: F, unblock: U) -> Option<R>
where
    F: FnOnce() -> R,
    U: Fn(),
{
    let mut call = Call {
        func: Some(func),
        result: None,
    };
    without_gvl(&mut call, &unblock, true);
    call.result.and_then(Result::ok)
}

/// [`nogvl`] for a call that can be cut short: `func` gets a channel that
/// receives when Ruby interrupts the call (Thread#kill, Thread#raise,
/// process shutdown), and must then return promptly. Ruby acts on the
/// interrupt once the native method returns, not by unwinding out of this
/// call, so whatever the method does after `func` (storing a result,
/// closing outputs) always happens, and nothing `func` returns is leaked.
/// If the interrupt was already pending, Ruby does not run `func`: it then
/// runs here, with the GVL, already cancelled. None if `func` panicked.
pub fn nogvl_cancellable<F, R>(func: F) -> Option<Cancellable<R>>
where
    F: FnOnce(&crossbeam_channel::Receiver<()>) -> R,
{
    let (cancel, cancelled) = crossbeam_channel::bounded::<()>(1);
    let interrupted = AtomicBool::new(false);
    let interrupt = || {
        interrupted.store(true, Ordering::SeqCst);
        let _ = cancel.try_send(());
    };
    let mut call = Call {
        func: Some(|| func(&cancelled)),
        result: None,
    };
    without_gvl(&mut call, &interrupt, false);
    if call.func.is_some() {
        interrupt();
        run(&mut call);
    }
    let value = call.result.and_then(Result::ok)?;
    Some(Cancellable {
        value,
        interrupted: interrupted.load(Ordering::SeqCst),
    })
}

/// What a [`nogvl_cancellable`] call returned, and whether Ruby interrupted
/// it. An interrupted call must not raise an error of its own: building the
/// exception runs Ruby code while the interrupt is pending, which magnus
/// takes for a fatal error (the process aborts). Such a call returns instead,
/// and Ruby acts on the interrupt as the method returns.
pub struct Cancellable<R> {
    pub value: R,
    pub interrupted: bool,
}

/// [`nogvl_cancellable`] for a wait that must resume after an interrupt
/// with nothing to act on. Ruby calls a blocked thread's unblock function
/// for more than Thread#kill and Thread#raise (seen on Ruby 3.3 in a freshly
/// forked child: the first wait of 3 in 32 children was cut short at once
/// with no interrupt pending). As Ruby's own blocking calls do, the interrupt
/// is acted on here (an exception or a kill comes back as the `Err`), then
/// `func` runs again while `unfinished` says its outcome is incomplete and
/// `budget`, counted from the first call, has not passed. None if `func` panicked.
pub fn nogvl_resuming<R>(
    ruby: &Ruby,
    budget: Duration,
    mut func: impl FnMut(&crossbeam_channel::Receiver<()>) -> R,
    unfinished: impl Fn(&R) -> bool,
) -> Result<Option<Cancellable<R>>, Error> {
    let deadline = Instant::now() + budget;
    loop {
        let Some(call) = nogvl_cancellable(&mut func) else {
            return Ok(None);
        };
        if !call.interrupted || !unfinished(&call.value) || Instant::now() >= deadline {
            return Ok(Some(call));
        }
        drop(call);
        // Through rb_protect: nothing is unwound past this frame.
        ruby.thread_check_ints()?;
    }
}
