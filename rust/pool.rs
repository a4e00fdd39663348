//! The one thread pool of the package, built lazily on first use.
//!
//! Its size comes from `set_num_threads`, else the environment variable
//! `COMPPO_NUM_THREADS`, else the number of available cores. Setting a new size swaps
//! in a new pool for later calls; a call already running keeps the pool it started on.
//! Results never depend on the size: every kernel computes each row independently and
//! reduces across rows in row order.

use crate::layout::{split_by_tasks, task_size, Layout, Task};
use std::sync::atomic::{AtomicUsize, Ordering};
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
/// tens of microseconds (more in a VM), more than the work.
pub const PARALLEL_MIN: usize = 1 << 15;

/// The tasks a parallel pass over `layout` is cut into: runs of whole consecutive rows
/// of about [`task_size`] positions for the current number of threads.
pub fn tasks(layout: &Layout) -> Vec<Task> {
    layout.tasks(task_size(layout.len(), num_threads()))
}

/// `(0..layout.rows()).map(f)` in row order, run by [`map`] over the [`tasks`] rather
/// than one item per row: handing an item over costs ~0.1 µs, as much as a short row's
/// work.
pub fn map_rows<R: Send>(layout: &Layout, parallel: bool, f: impl Fn(usize) -> R + Sync + Send) -> Vec<R> {
    map(tasks(layout), parallel, |task| task.rows.map(&f).collect::<Vec<R>>()).into_iter().flatten().collect()
}

/// `f(task, piece)` for each of the [`tasks`], in task order, where `piece` is the part
/// of `out` (an `[N]` array laid out by `layout`) that covers the task's span. Runs in
/// parallel for batches of at least [`PARALLEL_MIN`] positions.
pub fn map_pieces<T: Send, R: Send>(
    layout: &Layout,
    out: &mut [T],
    f: impl Fn(&Task, &mut [T]) -> R + Sync + Send,
) -> Vec<R> {
    let tasks = tasks(layout);
    let work: Vec<_> = tasks.iter().zip(split_by_tasks(out, &tasks)).collect();
    map(work, layout.len() >= PARALLEL_MIN, |(task, piece)| f(task, piece))
}

/// `items.map(f)` in order. When `parallel` (and there are at least two items and two
/// threads), the calling thread works through the items itself from the first moment
/// while `threads − 1` pool workers wake up and join in, each claiming the next
/// unclaimed item; else everything runs inline on the calling thread.
///
/// (Handing the whole job to the pool instead, as `install` does, makes every call pay
/// for waking the workers before any work starts, and leaves the caller idle: a batch
/// of 8 × 4096 tokens took longer on two threads than on one.)
///
/// Which thread computes an item never changes its result, so results do not depend on
/// the number of threads.
pub fn map<I: Send, R: Send>(items: Vec<I>, parallel: bool, f: impl Fn(I) -> R + Sync + Send) -> Vec<R> {
    let threads = num_threads();
    let n = items.len();
    if !(parallel && n > 1 && threads > 1) {
        return items.into_iter().map(f).collect();
    }
    // Each item is claimed exactly once (through `next`), so the locks are never
    // contended; they only hand items and results across threads safely.
    let unclaimed: Vec<Mutex<Option<I>>> = items.into_iter().map(|i| Mutex::new(Some(i))).collect();
    let results: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let work = || loop {
        let k = next.fetch_add(1, Ordering::Relaxed);
        if k >= n {
            break;
        }
        if let Some(item) = unclaimed[k].lock().unwrap_or_else(|e| e.into_inner()).take() {
            let r = f(item);
            *results[k].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        }
    };
    pool().in_place_scope(|scope| {
        for _ in 1..threads.min(n) {
            scope.spawn(|_| work());
        }
        work();
    });
    results
        .into_iter()
        .map(|r| r.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every item was claimed and computed"))
        .collect()
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
