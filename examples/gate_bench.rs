//! `cargo run --release --example gate_bench`: gates_from_concentration on a W1-like batch.
use _core::gating::{gates_from_concentration, GateParams, Normalize};
use _core::layout::Layout;
fn lcg(s: &mut u64) -> f32 {
    *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*s >> 40) as f32) / (1u64 << 24) as f32
}
fn main() {
    let (b, t) = (512usize, 4096usize);
    let n = b * t;
    let mut s = 1u64;
    let mut mask = vec![false; n];
    for row in 0..b {
        let len = t / 2 + (lcg(&mut s) * (t / 2) as f32) as usize;
        for i in 0..len {
            mask[row * t + i] = true;
        }
    }
    let c: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
    let mut out = vec![0f32; n];
    let layout = Layout::padded(b, t, n).unwrap();
    let m: &[bool] = &mask;
    let p = GateParams { low: 0.5, high: 1.0, sharpness: 1.0, normalize: Normalize::Sequence, invert: false };
    let mut best = f64::MAX;
    for _ in 0..30 {
        let t0 = std::time::Instant::now();
        gates_from_concentration(&layout, &c, m, &p, &mut out).unwrap();
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let valid = mask.iter().filter(|&&v| v).count();
    println!(
        "gates W1 ({} thread): {:.3} ms, {:.1} ns/valid token, {:.0} Mtok/s",
        _core::pool::num_threads(),
        best * 1e3,
        best * 1e9 / valid as f64,
        valid as f64 / best / 1e6
    );
}
