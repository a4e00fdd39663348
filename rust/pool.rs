//! The one thread pool of the package, built lazily on first use.
//!
//! Its size comes from `set_num_threads`, else the environment variable
//! `COMPPO_NUM_THREADS`, else the number of available cores. Setting a new size swaps
//! in a new pool for later calls; a call already running keeps the pool it started on.
//! Results never depend on the size: every kernel computes each row independently and
//! reduces across rows in row order.
//!
//! A parallel call ([`map`]) starts working on the calling thread at once while pool
//! workers wake up and join it.

use crate::layout::{split_by_tasks, task_size, Layout, Task};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// How long a call that has run out of items spins for the helpers still computing one
/// before it starts yielding its core between looks. A helper's item is a task of 1/32
/// of its share, tens of microseconds on the batches that run in parallel; sleeping
/// instead would cost a wake-up as long as that (50–90 µs on a small VM).
const JOIN_SPIN: Duration = Duration::from_micros(50);

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
/// The call waits only for the helpers that joined, and it waits by spinning: see
/// [`Helpers`]. Which thread computes an item never changes its result, so results do
/// not depend on the number of threads.
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
    Helpers::run(&pool(), threads.min(n) - 1, &work);
    results
        .into_iter()
        .map(|r| r.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every item was claimed and computed"))
        .collect()
}

/// The helpers of one [`map`] call: pool jobs that run the call's `work` too, and the
/// handshake that lets the call return without waiting for the ones that never started.
///
/// A scoped spawn (`rayon::scope`) would make the call wait until every helper job has
/// run, and block on a lock while it waits. On the 2-vCPU VMs this was tuned on, waking
/// a sleeping thread takes 50–70 µs: a helper that wakes after the caller has claimed
/// every item would still hold the call up that long, and so would waking the caller
/// when it blocked for a helper's last item (measured: 25–70 µs of every 800 µs call).
/// Here instead a helper *joins* (counts itself `active`) only while the call is still
/// open; the caller, when its own loop runs out of items, closes the call and spins
/// until no helper is active. A helper that arrives later finds it closed and leaves
/// without touching the call's data. Both sides use sequentially consistent order, so
/// either the caller sees the helper active or the helper sees the call closed.
struct Helpers {
    active: AtomicUsize,
    closed: AtomicBool,
    panicked: AtomicBool,
}

/// `work` with its lifetime erased, for the pool's `'static` jobs: it is only called
/// by a helper that joined the open call (see [`Helpers`]), and the call outlives
/// every joined helper.
struct WorkPtr(*const (dyn Fn() + Sync));

// SAFETY: the pointee is `Sync`, so it may be shared with (and called from) any thread.
unsafe impl Send for WorkPtr {}

impl Helpers {
    /// Runs `work` on the calling thread and on up to `count` pool workers, and returns
    /// once no worker can touch it any more. A panic in `work` on any thread is raised
    /// here after every joined helper has left.
    fn run(pool: &rayon::ThreadPool, count: usize, work: &(dyn Fn() + Sync)) {
        let shared = Arc::new(Helpers {
            active: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        });
        // SAFETY (of the transmute): only the lifetime changes; see `WorkPtr`.
        let erased: *const (dyn Fn() + Sync + 'static) =
            unsafe { std::mem::transmute(work as *const (dyn Fn() + Sync)) };
        for _ in 0..count {
            let (shared, job) = (shared.clone(), WorkPtr(erased));
            pool.spawn(move || {
                let job = job; // the whole wrapper, not its raw (non-`Send`) field
                shared.active.fetch_add(1, Ordering::SeqCst);
                if !shared.closed.load(Ordering::SeqCst) {
                    // SAFETY: joined while the call was open, so `run` is still waiting
                    // for this helper and `work` is alive.
                    let work = unsafe { &*job.0 };
                    if catch_unwind(AssertUnwindSafe(work)).is_err() {
                        shared.panicked.store(true, Ordering::SeqCst);
                    }
                }
                shared.active.fetch_sub(1, Ordering::SeqCst);
            });
        }
        let own = catch_unwind(AssertUnwindSafe(work));
        shared.closed.store(true, Ordering::SeqCst);
        // A joined helper holds at most the one item it is computing (a task of 1/32
        // of a thread's share), so the wait is short: spin for up to [`JOIN_SPIN`], then
        // yield the core between looks (the helper's thread may have been descheduled).
        let start = Instant::now();
        let mut looks = 0u32;
        while shared.active.load(Ordering::SeqCst) != 0 {
            looks = looks.wrapping_add(1);
            // Reading the clock costs ~20 ns: every 64th look only.
            if looks % 64 == 0 && start.elapsed() > JOIN_SPIN {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if let Err(payload) = own {
            resume_unwind(payload);
        }
        if shared.panicked.load(Ordering::SeqCst) {
            panic!("a comppo pool worker panicked");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The pool size is global: tests that set it run one at a time (those of other
    /// modules too).
    static SERIAL: Mutex<()> = Mutex::new(());

    pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn set_then_get() {
        let _serial = serial();
        set_num_threads(3);
        assert_eq!(num_threads(), 3);
        assert_eq!(install(rayon::current_num_threads), 3);
        set_num_threads(1);
        assert_eq!(install(rayon::current_num_threads), 1);
        assert_eq!(map((0..100).collect(), true, |x: i32| x * 2), (0..100).map(|x| x * 2).collect::<Vec<_>>());
        assert_eq!(map(vec![3], false, |x: i32| x + 1), vec![4]);
    }

    /// Many short calls in a row: helpers that arrive after the caller has closed a
    /// call must leave it alone (the items borrow the call's stack), and every result
    /// must come back in order whoever computed it.
    #[test]
    fn helpers_that_arrive_late_leave_the_call_alone() {
        let _serial = serial();
        set_num_threads(2);
        for round in 0..2000u64 {
            let data: Vec<u64> = (0..8).map(|i| i * round).collect();
            let items: Vec<usize> = (0..data.len()).collect();
            let spin = (round % 7) as usize * 50;
            let out = map(items, true, |i| {
                for _ in 0..spin {
                    std::hint::spin_loop();
                }
                data[i] + 1
            });
            assert_eq!(out, data.iter().map(|x| x + 1).collect::<Vec<_>>());
        }
    }

    /// A panic in an item, on whichever thread, reaches the caller once no helper is
    /// running, and the pool keeps working afterwards.
    #[test]
    fn a_panicking_item_reaches_the_caller() {
        let _serial = serial();
        set_num_threads(2);
        for bad in [0usize, 63] {
            let caught = catch_unwind(|| {
                map((0..64).collect(), true, |i: usize| {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                    assert!(i != bad, "item {i} fails");
                    i
                })
            });
            assert!(caught.is_err());
        }
        assert_eq!(map((0..64).collect(), true, |i: usize| i * 3), (0..64).map(|i| i * 3).collect::<Vec<_>>());
    }
}
