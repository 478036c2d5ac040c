//! The flow-matching Euler schedules of `FlowMatchEulerDiscreteScheduler` (diffusers ≥ 0.39:
//! custom sigmas `linspace(1, 1/N, N)`, final σ = 0), with a static shift or the exponential
//! time shift by an empirical μ.
//!
//! Every value is computed with the same f32/f64 roundings as torch on the CPU, so the
//! schedule is bit-identical to the reference (zimage-spec §4.3).

/// The `scheduler/scheduler_config.json` keys that shape the schedule.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct SchedulerConfig {
    #[serde(default = "default_train_steps")]
    pub num_train_timesteps: u32,
    #[serde(default = "default_shift")]
    pub shift: f32,
    #[serde(default)]
    pub use_dynamic_shifting: bool,
    /// How a dynamic shift bends the sigmas (`exponential`, the class default, or `linear`).
    #[serde(default)]
    pub time_shift_type: Option<String>,
    /// The dynamic shift's μ as a line in the image's token count, through
    /// `(base_image_seq_len, base_shift)` and `(max_image_seq_len, max_shift)`.
    #[serde(default = "default_base_shift")]
    pub base_shift: f64,
    #[serde(default = "default_max_shift")]
    pub max_shift: f64,
    #[serde(default = "default_base_seq_len")]
    pub base_image_seq_len: u64,
    #[serde(default = "default_max_seq_len")]
    pub max_image_seq_len: u64,
}

/// The most denoising steps a request may ask for: the scheduler was trained on 1000
/// timesteps, so more steps than that only sample the same model more finely at more cost,
/// and the bound keeps the schedule and the run's length sane.
pub const MAX_STEPS: usize = 1000;

impl SchedulerConfig {
    /// Checks the keys the schedule divides by, before anything runs.
    pub fn validate(&self) -> Result<(), String> {
        self.check_shift()?;
        if self.num_train_timesteps == 0 {
            return Err("scheduler `num_train_timesteps` is 0; it must be at least 1".into());
        }
        if self.use_dynamic_shifting {
            return Err(
                "scheduler `use_dynamic_shifting: true` is not supported (this schedule uses a static shift)"
                    .into(),
            );
        }
        Ok(())
    }

    /// Checks a schedule shifted per image by the empirical μ (FLUX.2): dynamic shifting on,
    /// exponential.
    pub fn validate_dynamic(&self) -> Result<(), String> {
        if !self.use_dynamic_shifting {
            return Err(
                "scheduler `use_dynamic_shifting: false` is not supported (FLUX.2 shifts by the image size)"
                    .into(),
            );
        }
        match self.time_shift_type.as_deref() {
            None | Some("exponential") => Ok(()),
            Some(other) => Err(format!(
                "scheduler `time_shift_type` `{other}` is not supported (only `exponential`)"
            )),
        }
    }
}

impl SchedulerConfig {
    /// The static shift every schedule divides by: finite and above 0.
    fn check_shift(&self) -> Result<(), String> {
        if !self.shift.is_finite() || self.shift <= 0.0 {
            return Err(format!(
                "scheduler `shift` is {}; it must be a finite number above 0",
                self.shift
            ));
        }
        Ok(())
    }

    /// Checks a schedule that shifts either statically or by the line μ of the config's
    /// sequence lengths (`calculate_shift`), exponentially.
    pub fn validate_shift_line(&self) -> Result<(), String> {
        self.check_shift()?;
        if !self.use_dynamic_shifting {
            return Ok(());
        }
        if self.base_image_seq_len == self.max_image_seq_len {
            return Err(format!(
                "scheduler `base_image_seq_len` and `max_image_seq_len` are both {}; μ is a line through two lengths",
                self.base_image_seq_len
            ));
        }
        if !(self.base_shift.is_finite() && self.max_shift.is_finite()) {
            return Err("scheduler `base_shift` and `max_shift` must be finite numbers".into());
        }
        self.validate_dynamic()
    }

    /// μ for `image_tokens` output tokens on the config's line, in f64 as diffusers'
    /// `calculate_shift` computes it (no clamping beyond the two lengths).
    pub fn line_mu(&self, image_tokens: usize) -> f64 {
        let (x0, x1) = (
            self.base_image_seq_len as f64,
            self.max_image_seq_len as f64,
        );
        let m = (self.max_shift - self.base_shift) / (x1 - x0);
        let b = self.base_shift - m * x0;
        image_tokens as f64 * m + b
    }

    /// The schedule for `steps` over `image_tokens`: the exponential shift by the line's μ
    /// when the config shifts dynamically, else its static shift applied to the same sigmas.
    pub fn line_schedule(&self, steps: usize, image_tokens: usize) -> Schedule {
        match self.use_dynamic_shifting {
            true => Schedule::exponential(steps, self.line_mu(image_tokens)),
            false => Schedule::shifted(steps, self.shift),
        }
    }
}

/// FLUX.2's μ for `image_tokens` output tokens and `steps` steps: a line in the step count
/// through the 10-step and the 200-step fits, or the 200-step value above 4300 tokens
/// (the FLUX.2 spec §6.2, evaluated in f64 in this order).
pub fn empirical_mu(image_tokens: usize, steps: usize) -> f64 {
    let (a1, b1, a2, b2) = (8.73809524e-05, 1.89833333, 0.00016927, 0.45666666);
    let s = image_tokens as f64;
    if image_tokens > 4300 {
        return a2 * s + b2;
    }
    let m200 = a2 * s + b2;
    let m10 = a1 * s + b1;
    let a = (m200 - m10) / 190.0;
    let b = m200 - 200.0 * a;
    a * steps as f64 + b
}

fn default_base_shift() -> f64 {
    0.5
}
fn default_max_shift() -> f64 {
    1.15
}
fn default_base_seq_len() -> u64 {
    256
}
fn default_max_seq_len() -> u64 {
    4096
}
fn default_train_steps() -> u32 {
    1000
}
fn default_shift() -> f32 {
    1.0
}

/// One denoising run's schedule: `sigmas` has `steps + 1` entries ending in 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub sigmas: Vec<f32>,
    /// `σ·1000` per step.
    pub timesteps: Vec<f32>,
}

impl Schedule {
    /// The schedule for `steps` forward passes with a static `shift`.
    pub fn new(steps: usize, shift: f32) -> Schedule {
        assert!(steps >= 1, "at least one step");
        let raw = linspace_like_torch(1.0, 1.0 / steps as f32, steps);
        let mut sigmas: Vec<f32> = raw
            .iter()
            .map(|&s| shift * s / (1.0 + (shift - 1.0) * s))
            .collect();
        let timesteps = sigmas.iter().map(|&s| s * 1000.0).collect();
        sigmas.push(0.0);
        Schedule { sigmas, timesteps }
    }

    /// The schedule for `steps` with the exponential time shift by `mu`: numpy's f64
    /// `linspace(1, 1/n, n)` rounded once to f32, then `e^μ / (e^μ + (1/σ − 1))` in f32 with
    /// `e^μ` rounded to f32 (the FLUX.2 spec §6.3).
    pub fn exponential(steps: usize, mu: f64) -> Schedule {
        let e = mu.exp() as f32;
        Schedule::from_sigmas(numpy_linspace(steps), |t| e / (e + (1.0 / t - 1.0)))
    }

    /// The schedule for `steps` with a static `shift` applied in f32 to numpy's
    /// `linspace(1, 1/n, n)` rounded to f32, as the scheduler treats sigmas a pipeline hands it.
    pub fn shifted(steps: usize, shift: f32) -> Schedule {
        Schedule::from_sigmas(numpy_linspace(steps), |s| {
            shift * s / (1.0 + (shift - 1.0) * s)
        })
    }

    fn from_sigmas(raw: Vec<f32>, shift: impl Fn(f32) -> f32) -> Schedule {
        let mut sigmas: Vec<f32> = raw.into_iter().map(shift).collect();
        let timesteps = sigmas.iter().map(|&s| s * 1000.0).collect();
        sigmas.push(0.0);
        Schedule { sigmas, timesteps }
    }

    pub fn steps(&self) -> usize {
        self.timesteps.len()
    }

    /// The time the transformer is given at step `i`: `(1000 − t)/1000`, which is 0 at pure
    /// noise. (Not `1 − σ`, which can differ in the last bit.)
    pub fn t_model(&self, i: usize) -> f32 {
        (1000.0 - self.timesteps[i]) / 1000.0
    }

    /// `σ[i+1] − σ[i]`, the Euler step along the noise direction.
    pub fn dt(&self, i: usize) -> f32 {
        self.sigmas[i + 1] - self.sigmas[i]
    }
}

/// numpy's f64 `linspace(1, 1/n, n)`, each value rounded once to f32.
fn numpy_linspace(n: usize) -> Vec<f32> {
    assert!(n >= 1, "at least one step");
    (0..n)
        .map(|i| match i + 1 == n {
            true => (1.0 / n as f64) as f32,
            false => (1.0 + i as f64 * ((1.0 / n as f64 - 1.0) / (n as f64 - 1.0))) as f32,
        })
        .collect()
}

/// torch's CPU `linspace` for f32: the step is computed in f32, each half of the range is
/// then stepped in f64 from its own end, with one rounding to f32.
fn linspace_like_torch(start: f32, end: f32, n: usize) -> Vec<f32> {
    if n == 1 {
        return vec![start];
    }
    let step = (end - start) / (n - 1) as f32;
    let half = n / 2;
    (0..n)
        .map(|i| {
            if i < half {
                (start as f64 + step as f64 * i as f64) as f32
            } else {
                (end as f64 - step as f64 * (n - 1 - i) as f64) as f32
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_schedules_match_the_spec() {
        assert!((empirical_mu(4096, 4) - 2.291180).abs() < 1e-6);
        assert!((empirical_mu(4096, 50) - 2.023351).abs() < 1e-6);
        assert!((empirical_mu(4301, 4) - 1.184697).abs() < 1e-6);
        let s = Schedule::exponential(4, empirical_mu(4096, 4));
        let hex: Vec<u32> = s.sigmas.iter().map(|x| x.to_bits()).collect();
        assert_eq!(hex, vec![0x3f800000, 0x3f77a67b, 0x3f687c1f, 0x3f446737, 0]);
    }

    #[test]
    fn turbo_eight_steps_match_the_reference_bits() {
        let s = Schedule::new(8, 3.0);
        let hex: Vec<u32> = s.sigmas.iter().map(|x| x.to_bits()).collect();
        assert_eq!(
            hex,
            vec![
                0x3f800000, 0x3f745d17, 0x3f666666, 0x3f555555, 0x3f400000, 0x3f249249, 0x3f000000,
                0x3e99999a, 0
            ]
        );
        assert_eq!(s.t_model(0), 0.0);
        assert_eq!(s.t_model(1), 0.045_454_59);
        assert_eq!(s.t_model(7), 0.7);
    }

    #[test]
    fn nine_steps_match_the_reference_bits() {
        let s = Schedule::new(9, 3.0);
        let hex: Vec<u32> = s.sigmas.iter().map(|x| x.to_bits()).collect();
        assert_eq!(
            hex,
            vec![
                0x3f800000, 0x3f75c290, 0x3f69bd39, 0x3f5b6db6, 0x3f4a1af3, 0x3f34b4b5, 0x3f199999,
                0x3eec4ec6, 0x3e8ba2e9, 0
            ]
        );
    }
}
