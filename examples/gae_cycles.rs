//! Cycles per position of the `f32` Comp-GAE kernel with data in cache, one thread:
//! the compute cost that decides W2 of `benches/compare.py` when its 21 MB run from L3.
//!
//! Run: `cargo run --release --example gae_cycles [T] [rows]` (defaults 4096 × 1: L2).
//! The clock is calibrated with a chain of dependent float64 additions (3 cycles each on
//! Zen 3 and recent Intel cores), so the figure is in core cycles at whatever frequency
//! the core runs.

use std::time::Instant;

use _core::{gae, GaeParams, Layout};

/// Nanoseconds per core cycle: a chain of dependent float64 additions, 3 cycles each
/// on Zen 3 and recent Intel cores.
#[cfg(target_arch = "x86_64")]
fn ns_per_cycle() -> f64 {
    let n = 20_000_000u64;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        // SAFETY: register arithmetic only.
        unsafe {
            std::arch::asm!(
                "2:",
                "addsd {x}, {x}", "addsd {x}, {x}", "addsd {x}, {x}", "addsd {x}, {x}",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) n => _,
                x = out(xmm_reg) _,
                options(nomem, nostack),
            );
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e9 / (n * 12) as f64);
    }
    best
}

fn main() {
    let no_mask = std::env::args().any(|a| a == "--no-mask");
    let args: Vec<usize> =
        std::env::args().skip(1).filter(|a| !a.starts_with("--")).map(|a| a.parse().expect("integer")).collect();
    let t = *args.first().unwrap_or(&4096);
    let rows = *args.get(1).unwrap_or(&1);
    let n = t * rows;
    let mut s = 1u64;
    let mut rnd = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let r: Vec<f32> = (0..n).map(|_| rnd() as f32 * 2.0 - 1.0).collect();
    let v: Vec<f32> = (0..n).map(|_| rnd() as f32 * 2.0 - 1.0).collect();
    let g: Vec<f32> = (0..n).map(|_| 0.5 + 0.5 * rnd() as f32).collect();
    let m = vec![true; n];
    let (mut a, mut ret) = (vec![0f32; n], vec![0f32; n]);
    _core::pool::set_num_threads(1);
    let layout = Layout::padded(rows, t, n).unwrap();
    let p = GaeParams::new(1.0, 0.95);
    let reps = (200_000_000 / n).max(10);
    let mut best = f64::MAX;
    for _ in 0..7 {
        let start = Instant::now();
        for _ in 0..reps {
            if no_mask {
                gae(&layout, &r, &v, _core::AllValid, &g[..], None, &p, &mut a, &mut ret).unwrap();
            } else {
                gae(&layout, &r, &v, &m[..], &g[..], None, &p, &mut a, &mut ret).unwrap();
            }
        }
        best = best.min(start.elapsed().as_secs_f64() * 1e9 / (reps * n) as f64);
    }
    let cycle = ns_per_cycle();
    println!(
        "T={t} rows={rows}: {:.2} cycles per position, {:.1} per block of four ({best:.4} ns/position at {:.2} GHz)",
        best / cycle,
        4.0 * best / cycle,
        1.0 / cycle
    );
}
