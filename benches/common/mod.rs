//! What the benchmarks share.

// Each benchmark compiles this module and uses its own subset.
#![allow(dead_code)]

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

/// The median of `v`.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The environment variable `name` parsed, else `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The benchmarks' text → image request: a `size`² fox in `steps` Turbo steps, seed 42.
pub fn fox_request(size: u32, steps: usize) -> zimage::pipeline::Request {
    zimage::pipeline::Request {
        prompt: "a red fox in the snow".into(),
        negative_prompt: None,
        width: size,
        height: size,
        steps,
        guidance: 0.0,
        cfg_normalization: false,
        cfg_truncation: 1.0,
        seed: 42,
        noise: None,
        input: None,
    }
}
