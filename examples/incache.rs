//! The GAE block loop's cost per position in cache, one thread, against a plain
//! streaming pass over the same arrays: one sequence of `n` float32 positions (default
//! 16384, about 340 KB with the outputs) computed over and over, packed and padded
//! (all valid). `cargo run --release --example incache [n]`. Cycles assume 3.1 GHz.
use _core::{gae, GaeParams, Layout};
use std::time::Instant;
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
        println!("round {round} n={n}: packed {:.3} ns/el  masked-all-valid {:.3} ns/el  floor {:.3} ns/el  (x3.1GHz: {:.2} {:.2} {:.2} cyc)", tp*1e9, tm*1e9, tf*1e9, tp*3.1e9, tm*3.1e9, tf*3.1e9);
    }
}
