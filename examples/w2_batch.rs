//! W2 of `benches/compare.py` in Rust, with no Python around the kernel: 64 rows of
//! 16384 float32 positions, each row valid for a length uniform in [8192, 16384] and
//! padded on the right, gates in [0.5, 1], γ = 1, λ = 0.95. The arrays ask for
//! transparent huge pages, as NumPy's do. Prints the 10th percentile and the median of
//! the per-call times (`examples/incache.rs` gives the cycles per position in cache).
//!
//! `COMPPO_NUM_THREADS=1 cargo run --release --example w2_batch` for one core. To
//! compare two builds, copy each build's `target/release/examples/w2_batch` aside and
//! run the copies in turn, several times each: on a shared VM a run can fall in a slow
//! window, so compare the fastest and the middle runs, not one pair.
use _core::{gae, GaeParams, Layout};
use std::time::Instant;

const ROWS: usize = 64;
const COLS: usize = 16384;

fn lcg(s: &mut u64) -> f32 {
    *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*s >> 40) as f32) / (1u64 << 24) as f32
}

/// `n` values of `f` in a buffer that asks for transparent huge pages.
fn huge<T: Copy>(n: usize, mut f: impl FnMut(usize) -> T) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(n);
    #[cfg(target_os = "linux")]
    {
        extern "C" {
            fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
        }
        const MADV_HUGEPAGE: i32 = 14;
        let (start, len) = (v.as_mut_ptr() as usize, n * std::mem::size_of::<T>());
        let first = (start + (1 << 21) - 1) & !((1 << 21) - 1);
        if first + (1 << 21) <= start + len {
            // SAFETY: advice on whole pages inside this allocation; failure is harmless.
            unsafe { madvise(first as *mut _, (start + len - first) & !((1 << 21) - 1), MADV_HUGEPAGE) };
        }
    }
    v.extend((0..n).map(&mut f));
    v
}

fn main() {
    let n = ROWS * COLS;
    let mut s = 2u64;
    let lens: Vec<usize> =
        (0..ROWS).map(|_| (COLS / 2 + (lcg(&mut s) * (COLS / 2 + 1) as f32) as usize).min(COLS)).collect();
    let mask = huge(n, |i| i % COLS < lens[i / COLS]);
    let rewards = huge(n, |i| if mask[i] { lcg(&mut s) - 0.5 } else { 0.0 });
    let values = huge(n, |_| lcg(&mut s));
    let gates = huge(n, |_| 0.5 + 0.5 * lcg(&mut s));
    let (mut adv, mut ret) = (huge(n, |_| 0f32), huge(n, |_| 0f32));
    let layout = Layout::padded(ROWS, COLS, n).unwrap();
    let p = GaeParams::new(1.0, 0.95);
    let valid: usize = lens.iter().sum();
    let mut times = vec![];
    for _ in 0..300 {
        let t0 = Instant::now();
        gae(&layout, &rewards, &values, &mask[..], &gates[..], None, &p, &mut adv, &mut ret).unwrap();
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let (p10, p50) = (times[times.len() / 10], times[times.len() / 2]);
    println!(
        "W2 {ROWS}x{COLS}, {valid} valid, threads={}: p10 {:.3} ms  median {:.3} ms",
        _core::pool::num_threads(),
        p10 * 1e3,
        p50 * 1e3,
    );
}
