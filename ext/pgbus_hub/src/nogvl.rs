//! Running blocking native code without the GVL, so other Ruby threads keep
//! running; `unblock` is how Ruby interrupts it (Thread#kill, Thread#raise,
//! process shutdown): it must make `func` return promptly.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

struct Call<F, R> {
    func: Option<F>,
    result: Option<std::thread::Result<R>>,
}

unsafe extern "C" fn trampoline<F: FnOnce() -> R, R>(data: *mut c_void) -> *mut c_void {
    // SAFETY: `data` is the `Call` on `nogvl`'s stack, alive for the whole call.
    let call = unsafe { &mut *(data as *mut Call<F, R>) };
    if let Some(func) = call.func.take() {
        // A panic must not unwind into Ruby's C frames.
        call.result = Some(catch_unwind(AssertUnwindSafe(func)));
    }
    std::ptr::null_mut()
}

unsafe extern "C" fn unblock_trampoline<U: Fn()>(data: *mut c_void) {
    // SAFETY: `data` is the `U` on `nogvl`'s stack, alive for the whole call.
    let unblock = unsafe { &*(data as *const U) };
    let _ = catch_unwind(AssertUnwindSafe(unblock));
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
    // SAFETY: both pointers outlive the call; the trampolines match their data types.
    unsafe {
        rb_sys::rb_thread_call_without_gvl(
            Some(trampoline::<F, R>),
            &mut call as *mut Call<F, R> as *mut c_void,
            Some(unblock_trampoline::<U>),
            &unblock as *const U as *mut c_void,
        );
    }
    call.result.and_then(Result::ok)
}

/// [`nogvl`] for a wait that can be cut short: `func` gets a channel that
/// receives when Ruby interrupts the call (Thread#kill, Thread#raise), and
/// must then return promptly.
pub fn nogvl_cancellable<F, R>(func: F) -> Option<R>
where
    F: FnOnce(&crossbeam_channel::Receiver<()>) -> R,
{
    let (cancel, cancelled) = crossbeam_channel::bounded::<()>(1);
    nogvl(
        move || func(&cancelled),
        move || {
            let _ = cancel.try_send(());
        },
    )
}
