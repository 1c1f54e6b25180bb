//! Where the commands run their model: on a thread of rayon's pool.

/// Runs `work` on a thread of rayon's pool and returns its result. The kernels split each
/// projection and attention call over the pool; called from a pool thread, that thread takes
/// part (as the calling thread of an OpenMP region does in PyTorch), and no thread outside the
/// pool waits to be woken at the end of each parallel loop: the ~50 loops of a decoding step,
/// or the 4 of a short multi-head attention call, where the wake-ups are a measurable part of
/// the time.
pub(crate) fn on_rayon_pool<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    let mut result = None;
    rayon::scope(|s| s.spawn(|_| result = Some(work())));
    result.expect("a rayon scope runs its spawned job before returning")
}
