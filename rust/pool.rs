//! The one thread pool of the package, built lazily on first use.
//!
//! Its size comes from `set_num_threads`, else the environment variable
//! `COMPPO_NUM_THREADS`, else the number of available cores. Setting a new size swaps
//! in a new pool for later calls; a call already running keeps the pool it started on.
//! Results never depend on the size: every kernel computes each row independently and
//! reduces across rows in row order.

use std::sync::{Arc, Mutex};

pub const ENV_VAR: &str = "COMPPO_NUM_THREADS";

struct PoolState {
    threads: Option<usize>,
    pool: Option<Arc<rayon::ThreadPool>>,
}

static STATE: Mutex<PoolState> = Mutex::new(PoolState { threads: None, pool: None });

fn default_threads() -> usize {
    std::env::var(ENV_VAR)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

fn lock() -> std::sync::MutexGuard<'static, PoolState> {
    // A poisoned lock only means another thread panicked while holding it; the state
    // (two plain fields) is still consistent.
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The number of threads kernels use.
pub fn num_threads() -> usize {
    let mut st = lock();
    *st.threads.get_or_insert_with(default_threads)
}

/// Sets the number of threads for later calls (`n >= 1`).
pub fn set_num_threads(n: usize) {
    let mut st = lock();
    let n = n.max(1);
    if st.threads != Some(n) {
        st.threads = Some(n);
        st.pool = None;
    }
}

fn pool() -> Arc<rayon::ThreadPool> {
    let mut st = lock();
    let threads = *st.threads.get_or_insert_with(default_threads);
    if let Some(p) = &st.pool {
        return p.clone();
    }
    let p = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("comppo-{i}"))
            .build()
            .expect("building the comppo thread pool"),
    );
    st.pool = Some(p.clone());
    p
}

/// Runs `f` inside the package's pool (rayon parallel iterators in `f` use it).
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    pool().install(f)
}

/// Below this many positions a call runs on the calling thread: waking the pool costs
/// tens of microseconds, more than the work.
pub const PARALLEL_MIN: usize = 1 << 15;

/// `items.map(f)` in order, on the pool when `parallel` (and there are at least two
/// items), else inline on the calling thread.
pub fn map<I: Send, R: Send>(items: Vec<I>, parallel: bool, f: impl Fn(I) -> R + Sync + Send) -> Vec<R> {
    use rayon::prelude::*;
    if parallel && items.len() > 1 {
        install(|| items.into_par_iter().map(f).collect())
    } else {
        items.into_iter().map(f).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_then_get() {
        set_num_threads(3);
        assert_eq!(num_threads(), 3);
        assert_eq!(install(rayon::current_num_threads), 3);
        set_num_threads(1);
        assert_eq!(install(rayon::current_num_threads), 1);
        assert_eq!(map((0..100).collect(), true, |x: i32| x * 2), (0..100).map(|x| x * 2).collect::<Vec<_>>());
        assert_eq!(map(vec![3], false, |x: i32| x + 1), vec![4]);
    }
}
