//! Ctrl-C: the first SIGINT asks the run to stop after the operations in flight, so that what was
//! measured is still printed and saved; a second one kills the process as usual.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_signal: libc::c_int) {
    // Only an atomic store: the one thing a signal handler may safely do here.
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Install the handler (once per process is enough; installing again is harmless).
pub fn install() {
    // SAFETY: `action` is fully initialised (zeroed, then its mask emptied) before sigaction reads
    // it, and the handler only stores to an atomic, which is async-signal-safe. SA_RESETHAND puts
    // the default action back after the first signal, so a second Ctrl-C still kills a stuck run.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESETHAND | libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut());
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}
