//! Quick kernel-only timing for development (no Python): W1/W3-like padded batches and
//! the W4-like packed batch against a parallel streaming pass over the same bytes.
//! `cargo run --release --example kernel_bench`. The benchmark users should read is
//! benches/compare.py; this one only helps tune the Rust loop.

use _core::{gae, GaeParams, Layout};
use rayon::prelude::*;
use std::time::Instant;

fn lcg(s: &mut u64) -> f32 {
    *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*s >> 40) as f32) / (1u64 << 24) as f32
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// The plain row loop a user would write (γ, λ constants; no checks), for calibration.
fn simple_rows(t: usize, r: &[f32], v: &[f32], g: &[f32], m: &[bool], a: &mut [f32], ret: &mut [f32]) {
    let (gamma, lam) = (1.0f64, 0.95f64);
    _core::pool::install(|| {
        (r.par_chunks(t), v.par_chunks(t), g.par_chunks(t), m.par_chunks(t), a.par_chunks_mut(t), ret.par_chunks_mut(t))
            .into_par_iter()
            .for_each(|(r, v, g, m, a, ret)| {
                let (mut acc, mut vn) = (0.0f64, 0.0f64);
                for i in (0..r.len()).rev() {
                    let valid = m[i];
                    let (ri, vi) = (r[i] as f64, v[i] as f64);
                    let gg = gamma * g[i] as f64;
                    let d = ri + gg * vn - vi;
                    let an = d + (gg * lam) * acc;
                    acc = if valid { an } else { acc };
                    vn = if valid { vi } else { vn };
                    a[i] = if valid { an as f32 } else { 0.0 };
                    ret[i] = if valid { (an + vi) as f32 } else { 0.0 };
                }
            })
    });
}

fn bench_groups(rounds: usize) {
    let n = 65536;
    let mut s = 3u64;
    let scores: Vec<f64> = (0..n).map(|_| lcg(&mut s) as f64).collect();
    let mut groups: Vec<i64> = (0..n).map(|i| (i / 16) as i64 * 7 + 3).collect();
    for i in (1..n).rev() {
        let j = (lcg(&mut s) * i as f32) as usize;
        groups.swap(i, j);
    }
    let mut out = vec![0.0; n];
    let mut t = vec![];
    for _ in 0..rounds {
        let t0 = Instant::now();
        _core::outcome::group_advantages(
            &scores,
            &groups,
            _core::outcome::Method::Grpo,
            1e-6,
            _core::outcome::Singleton::Zero,
            &mut out,
        )
        .unwrap();
        t.push(t0.elapsed().as_secs_f64());
    }
    println!("group_advantages 65536/16: {:.3} ms", median(t) * 1e3);
}

fn main() {
    let rounds = 30;
    bench_groups(rounds);
    for (name, b, t) in [("W1 512x4096", 512usize, 4096usize), ("W2 64x16384", 64, 16384), ("W3 4096x512", 4096, 512)] {
        let n = b * t;
        let mut s = 1u64;
        let mut mask = vec![false; n];
        let mut lens = vec![0usize; b];
        for row in 0..b {
            let len = t / 2 + (lcg(&mut s) * (t / 2) as f32) as usize;
            lens[row] = len;
            for i in 0..len {
                mask[row * t + i] = true;
            }
        }
        let r: Vec<f32> = (0..n).map(|i| if mask[i] { lcg(&mut s) - 0.5 } else { 0.0 }).collect();
        let v: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
        let g: Vec<f32> = (0..n).map(|_| 0.5 + 0.5 * lcg(&mut s)).collect();
        let (mut a, mut ret) = (vec![0f32; n], vec![0f32; n]);
        let (mut o1, mut o2) = (vec![0f32; n], vec![0f32; n]);
        let layout = Layout::padded(b, t, n).unwrap();
        let p = GaeParams::new(1.0, 0.95);
        // packed version of the same data
        let mut cu = vec![0i64];
        let (mut pr, mut pv, mut pg) = (vec![], vec![], vec![]);
        for row in 0..b {
            for i in 0..lens[row] {
                pr.push(r[row * t + i]);
                pv.push(v[row * t + i]);
                pg.push(g[row * t + i]);
            }
            cu.push(pr.len() as i64);
        }
        let np_ = pr.len();
        let packed = Layout::packed(&cu, np_).unwrap();
        let (mut pa, mut pret) = (vec![0f32; np_], vec![0f32; np_]);
        let (mut po1, mut po2) = (vec![0f32; np_], vec![0f32; np_]);

        // A u8 mask has no AVX2 block loop: it times the scalar loop on the same data.
        let mask8: Vec<u8> = mask.iter().map(|&b| b as u8).collect();
        let (mut tk, mut tf, mut tkp, mut tfp, mut tstep) = (vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..rounds {
            let t0 = Instant::now();
            gae(&layout, &r, &v, &mask8[..], &g[..], None, &p, &mut a, &mut ret).unwrap();
            tstep.push(t0.elapsed().as_secs_f64());
            let t0 = Instant::now();
            gae(&layout, &r, &v, &mask[..], &g[..], None, &p, &mut a, &mut ret).unwrap();
            tk.push(t0.elapsed().as_secs_f64());
            let t0 = Instant::now();
            _core::pool::install(|| {
                (
                    o1.par_chunks_mut(1 << 16),
                    o2.par_chunks_mut(1 << 16),
                    r.par_chunks(1 << 16),
                    g.par_chunks(1 << 16),
                    v.par_chunks(1 << 16),
                    mask.par_chunks(1 << 16),
                )
                    .into_par_iter()
                    .for_each(|(x, y, r, g, v, m)| {
                        for (((x, y), (r, g)), (v, m)) in
                            x.iter_mut().zip(y.iter_mut()).zip(r.iter().zip(g)).zip(v.iter().zip(m))
                        {
                            *x = r + g;
                            *y = v + (*m as u8 as f32);
                        }
                    })
            });
            tf.push(t0.elapsed().as_secs_f64());
            let t0 = Instant::now();
            gae(&packed, &pr, &pv, _core::AllValid, &pg[..], None, &p, &mut pa, &mut pret).unwrap();
            tkp.push(t0.elapsed().as_secs_f64());
            let t0 = Instant::now();
            _core::pool::install(|| {
                (
                    po1.par_chunks_mut(1 << 16),
                    po2.par_chunks_mut(1 << 16),
                    pr.par_chunks(1 << 16),
                    pg.par_chunks(1 << 16),
                    pv.par_chunks(1 << 16),
                )
                    .into_par_iter()
                    .for_each(|(x, y, r, g, v)| {
                        for ((x, y), ((r, g), v)) in x.iter_mut().zip(y.iter_mut()).zip(r.iter().zip(g).zip(v)) {
                            *x = r + g;
                            *y = *v;
                        }
                    })
            });
            tfp.push(t0.elapsed().as_secs_f64());
        }
        let mut ts = vec![];
        for _ in 0..rounds {
            let t0 = Instant::now();
            simple_rows(t, &r, &v, &g, &mask, &mut a, &mut ret);
            ts.push(t0.elapsed().as_secs_f64());
        }
        println!("  plain row loop (no checks) {:.2} ms", median(ts) * 1e3);

        let (k, f, kp, fp) = (median(tk), median(tf), median(tkp), median(tfp));
        println!("  scalar loop (u8 mask) ratio {:.2}", median(tstep) / f);
        println!(
            "{name}: padded kernel {:.2} ms floor {:.2} ms ratio {:.2} | packed kernel {:.2} ms floor {:.2} ms ratio {:.2}",
            k * 1e3, f * 1e3, k / f, kp * 1e3, fp * 1e3, kp / fp
        );
        let mut tw = vec![];
        for _ in 0..rounds {
            let t0 = Instant::now();
            _core::whiten::masked_whiten(&layout, &r, &mask[..], true, 1e-8, &mut a).unwrap();
            tw.push(t0.elapsed().as_secs_f64());
        }
        println!("  masked_whiten {:.2} ms", median(tw) * 1e3);
        let mut tm = vec![];
        for _ in 0..rounds {
            let t0 = Instant::now();
            std::hint::black_box(_core::whiten::batch_moments(&layout, &r, &&mask[..], "x").unwrap());
            tm.push(t0.elapsed().as_secs_f64());
        }
        println!("  batch_moments {:.2} ms", median(tm) * 1e3);
        std::hint::black_box((&a, &ret, &o1, &o2, &pa, &pret, &po1, &po2));
    }
}
