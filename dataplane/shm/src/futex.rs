//! Cross-process wake-ups on 32-bit words in shared memory.
//!
//! Shared (non-private) futexes, because waiter and waker are different
//! processes mapping the same object; `FUTEX_WAIT` works on a read-only
//! mapping, which is what lets a client sleep on the server's `tail_event`
//! without being able to write it. Every wait has a timeout so that a peer
//! that died without waking us is noticed by the caller's liveness check.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::thread::futex;

/// Sleeps while `*word == expected`, at most `timeout`. Returns on wake-up,
/// value change, timeout or signal; callers re-check their condition.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos() as i64,
    };
    // EAGAIN (value changed), ETIMEDOUT and EINTR are all "go and re-check".
    let _ = futex::wait(word, futex::Flags::empty(), expected, Some(&ts));
}

/// Wakes every process sleeping on `word`.
pub(crate) fn wake_all(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}
