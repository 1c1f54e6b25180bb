//! The per-thread scratch buffer of the CPU kernels, reused across tiles, tasks and calls, so
//! that a kernel does not allocate (and first-touch fresh pages) per call.
//!
//! Reuse must not turn into a leak: a single call with a huge head dimension or input width
//! would otherwise leave every thread of the pool holding its high-water mark for the life of
//! the process. Two rules bound it:
//!
//! * a buffer larger than [`RELEASE_ABOVE`] floats is freed when the call that used it
//!   returns (a call that big costs far more than one allocation);
//! * a buffer larger than [`RETAIN`] floats is replaced by one of the requested size when a
//!   call asks for less than a quarter of it (the next small call after a big one).
//!
//! Buffers up to [`RETAIN`] floats (what attention with head dimensions up to a few hundred
//! needs) are simply kept.

use std::cell::RefCell;

/// Buffers up to this many floats (1 MiB) are kept whatever the next request.
pub(crate) const RETAIN: usize = 1 << 18;
/// Buffers above this many floats (16 MiB) are freed as soon as the call returns.
pub(crate) const RELEASE_ABOVE: usize = 1 << 22;

thread_local! {
    /// Per-thread scratch, grown on demand and reused across tiles, tasks and calls (bounded
    /// by the rules of the module documentation).
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with a per-thread scratch buffer of at least `len` floats (contents unspecified).
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.capacity() > RETAIN && len < buf.capacity() / 4 {
                // A fresh buffer of the size asked for, not a shrink: its old contents are
                // not needed, so there is nothing to copy.
                *buf = Vec::new();
            }
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
            let r = f(&mut buf[..len]);
            if buf.capacity() > RELEASE_ABOVE {
                *buf = Vec::new();
            }
            r
        }
        // Re-entrant use on one thread (not expected): fall back to a fresh buffer.
        Err(_) => f(&mut vec![0.0; len]),
    })
}

/// The capacity, in floats, of this thread's scratch buffer.
#[cfg(test)]
pub(crate) fn scratch_capacity() -> usize {
    SCRATCH.with(|cell| cell.borrow().capacity())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a thread of its own, so the thread-local buffer starts empty and no other
    /// test's kernels touch it.
    fn on_fresh_thread(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(f).join().unwrap();
    }

    #[test]
    fn small_buffers_are_reused() {
        on_fresh_thread(|| {
            with_scratch(1000, |s| s.fill(1.0));
            let cap = scratch_capacity();
            assert!(cap >= 1000);
            with_scratch(10, |s| assert_eq!(s.len(), 10));
            with_scratch(1000, |s| assert_eq!(s.len(), 1000));
            assert_eq!(
                scratch_capacity(),
                cap,
                "a buffer within RETAIN is kept as it is"
            );
        });
    }

    #[test]
    #[cfg_attr(miri, ignore = "8 MiB of zeroing is minutes under Miri; plain logic")]
    fn a_large_call_followed_by_a_small_one_leaves_the_scratch_small() {
        on_fresh_thread(|| {
            let large = RELEASE_ABOVE / 2; // kept after the call: above RETAIN, below release
            with_scratch(large, |s| s[large - 1] = 1.0);
            assert!(scratch_capacity() >= large);
            with_scratch(100, |s| assert_eq!(s.len(), 100));
            assert!(
                scratch_capacity() < RETAIN,
                "after a small call the scratch holds {} floats",
                scratch_capacity()
            );
            // Requests near the current size keep the buffer (no reallocation per call).
            with_scratch(3 * RETAIN, |_| {});
            let cap = scratch_capacity();
            with_scratch(RETAIN, |_| {});
            assert_eq!(scratch_capacity(), cap);
        });
    }

    #[test]
    #[cfg_attr(miri, ignore = "32 MiB of zeroing is minutes under Miri; plain logic")]
    fn a_huge_buffer_is_released_when_the_call_returns() {
        on_fresh_thread(|| {
            let huge = RELEASE_ABOVE + 1;
            let seen = with_scratch(huge, |s| s.len());
            assert_eq!(seen, huge);
            assert_eq!(scratch_capacity(), 0);
            // And the next call still gets what it asks for.
            with_scratch(huge, |s| assert_eq!(s.len(), huge));
        });
    }

    #[test]
    fn reentrant_use_gets_a_buffer_of_its_own() {
        on_fresh_thread(|| {
            with_scratch(8, |outer| {
                outer.fill(2.0);
                with_scratch(4, |inner| inner.fill(3.0));
                assert!(outer.iter().all(|&x| x == 2.0));
            });
        });
    }
}
