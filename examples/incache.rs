//! The GAE block loop's cost per position in cache, one thread, against a plain
//! streaming pass over the same arrays: one sequence of `n` float32 positions (default
//! 16384, about 340 KB with the outputs) computed call after call, packed and padded
//! (all valid), the three alternating. `cargo run --release --example incache [n]`.
//!
//! Each figure is the 10th percentile of the per-call times, in core cycles per
//! position: on a shared VM a slow window (another tenant, a clock change) stretches
//! whole runs of calls, and a total or mean over the run would report the window; the
//! fast tenth of the calls repeats to about 1% from run to run. Cycles are calibrated
//! by a chain of dependent float64 additions (3 cycles each on Zen 3 and recent Intel
//! cores) whatever the clock runs at. This is the compute cost that decides W2 of
//! `benches/compare.py` when its 21 MB run from the L3 cache.
use _core::{gae, GaeParams, Layout};
use std::time::Instant;

/// Nanoseconds per core cycle.
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

/// Elsewhere: an assumed 3.1 GHz.
#[cfg(not(target_arch = "x86_64"))]
fn ns_per_cycle() -> f64 {
    1.0 / 3.1
}

fn lcg(s: &mut u64) -> f32 {
    *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*s >> 40) as f32) / (1u64 << 24) as f32
}

#[inline(never)]
fn floor(r: &[f32], v: &[f32], g: &[f32], m: &[bool], o1: &mut [f32], o2: &mut [f32]) {
    let n = r.len();
    let (r, v, g, m, o1, o2) = (&r[..n], &v[..n], &g[..n], &m[..n], &mut o1[..n], &mut o2[..n]);
    for i in 0..n {
        o1[i] = r[i] + g[i];
        o2[i] = v[i] + m[i] as u8 as f32;
    }
}

/// The `q` quantile of `times`.
fn quantile(times: &mut [f64], q: f64) -> f64 {
    times.sort_by(f64::total_cmp);
    times[((times.len() - 1) as f64 * q) as usize]
}

fn main() {
    let n: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(16384);
    let calls = ((1usize << 28) / n).clamp(50, 20_000);
    let mut s = 1u64;
    let r: Vec<f32> = (0..n).map(|_| lcg(&mut s) - 0.5).collect();
    let v: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
    let g: Vec<f32> = (0..n).map(|_| 0.5 + 0.5 * lcg(&mut s)).collect();
    let m = vec![true; n];
    let (mut a, mut ret) = (vec![0f32; n], vec![0f32; n]);
    let p = GaeParams::new(1.0, 0.95);
    let cu = [0i64, n as i64];
    let packed = Layout::packed(&cu, n).unwrap();
    let padded = Layout::padded(1, n, n).unwrap();
    let cycle = ns_per_cycle();
    for round in 0..3 {
        let (mut tp, mut tm, mut tf) = (vec![], vec![], vec![]);
        for _ in 0..calls {
            let t0 = Instant::now();
            gae(&packed, &r, &v, _core::AllValid, &g[..], None, &p, &mut a, &mut ret).unwrap();
            tp.push(t0.elapsed().as_secs_f64());
            let t0 = Instant::now();
            gae(&padded, &r, &v, &m[..], &g[..], None, &p, &mut a, &mut ret).unwrap();
            tm.push(t0.elapsed().as_secs_f64());
            let t0 = Instant::now();
            floor(&r, &v, &g, &m, &mut a, &mut ret);
            std::hint::black_box(&a);
            tf.push(t0.elapsed().as_secs_f64());
        }
        let cyc = |t: &mut Vec<f64>| quantile(t, 0.1) * 1e9 / cycle / n as f64;
        println!(
            "round {round} n={n}: cycles per position (p10 of {calls} calls): packed {:.2}  masked-all-valid {:.2}  floor {:.2}  ({:.2} GHz)",
            cyc(&mut tp),
            cyc(&mut tm),
            cyc(&mut tf),
            1.0 / cycle
        );
    }
}
