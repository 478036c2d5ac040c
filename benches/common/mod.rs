//! What the benchmarks share.

use std::time::Instant;

/// The fastest of `reps` timed runs of `f`, after one untimed run that warms it up.
pub fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}
