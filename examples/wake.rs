//! How long a thread sleeping on a condition variable takes to wake, after the calling
//! thread has worked alone for a while (the situation of a pool worker when a kernel
//! call arrives), and how long the notification itself holds up the waking thread.
//! `cargo run --release --example wake`.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
fn main() {
    let epoch = Instant::now();
    let pair = Arc::new((Mutex::new(0u64), Condvar::new()));
    let woke = Arc::new(AtomicU64::new(0));
    let (p2, w2) = (pair.clone(), woke.clone());
    std::thread::spawn(move || {
        let mut seen = 0u64;
        loop {
            let (m, c) = &*p2;
            let mut g = m.lock().unwrap();
            while *g == seen {
                g = c.wait(g).unwrap();
            }
            seen = *g;
            drop(g);
            w2.store(epoch.elapsed().as_nanos() as u64, Ordering::Release);
        }
    });
    for gap_us in [20u64, 100, 500, 1000, 3000] {
        let (mut lat, mut cost) = (vec![], vec![]);
        for k in 1..=200u64 {
            let until = Instant::now() + Duration::from_micros(gap_us);
            // spin on the main thread (like Python work) while the worker sleeps
            while Instant::now() < until {}
            woke.store(0, Ordering::Release);
            let t0 = epoch.elapsed().as_nanos() as u64;
            {
                let (m, c) = &*pair;
                *m.lock().unwrap() += 1;
                c.notify_one();
            }
            cost.push((epoch.elapsed().as_nanos() as u64 - t0) as f64 / 1e3);
            let mut t1;
            loop {
                t1 = woke.load(Ordering::Acquire);
                if t1 != 0 {
                    break;
                }
            }
            let _ = k;
            lat.push((t1 - t0) as f64 / 1e3);
        }
        lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
        cost.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "gap {gap_us:5} us: wake median {:.1} us p10 {:.1} p90 {:.1} max {:.1}; notifying median {:.1} us p10 {:.1} p90 {:.1}",
            lat[100], lat[20], lat[180], lat[199], cost[100], cost[20], cost[180]
        );
    }
}
