//! The GAE block loop's cost per position in cache, one thread, against a plain
//! streaming pass over the same arrays: one sequence of `n` float32 positions (default
//! 16384, about 340 KB with the outputs) computed over and over, packed and padded
//! (all valid). `cargo run --release --example incache [n]`. Cycles are core cycles,
//! calibrated by a chain of dependent float64 additions (3 cycles each on Zen 3 and
//! recent Intel cores) whatever the clock runs at. This is the compute cost that
//! decides W2 of `benches/compare.py` when its 21 MB run from the L3 cache.
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
fn main() {
    let n: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(16384);
    let reps = (1usize << 28) / n;
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
    for round in 0..3 {
        let t0 = Instant::now();
        for _ in 0..reps {
            gae(&packed, &r, &v, _core::AllValid, &g[..], None, &p, &mut a, &mut ret).unwrap();
        }
        let tp = t0.elapsed().as_secs_f64() / (reps * n) as f64;
        let t0 = Instant::now();
        for _ in 0..reps {
            gae(&padded, &r, &v, &m[..], &g[..], None, &p, &mut a, &mut ret).unwrap();
        }
        let tm = t0.elapsed().as_secs_f64() / (reps * n) as f64;
        let t0 = Instant::now();
        for _ in 0..reps {
            floor(&r, &v, &g, &m, &mut a, &mut ret);
            std::hint::black_box(&a);
        }
        let tf = t0.elapsed().as_secs_f64() / (reps * n) as f64;
        let cycle = ns_per_cycle();
        let cyc = |t: f64| t * 1e9 / cycle;
        println!(
            "round {round} n={n}: cycles per position: packed {:.2}  masked-all-valid {:.2}  floor {:.2}  ({:.2} GHz)",
            cyc(tp),
            cyc(tm),
            cyc(tf),
            1.0 / cycle
        );
    }
}
