//! `GET /metrics`: the server's work in Prometheus' text format, written by `prometheus-client`.
//!
//! Jobs are counted where the worker takes and finishes them ([`super::worker`]), once for every
//! API, so the counts cannot drift from what the routes do. The queue's depth, the running job
//! and the process's memory are read when the page is asked for; MLX's memory is set by the
//! worker thread, which owns MLX.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::time::Duration;

/// The content type of the exposition `prometheus-client` writes (OpenMetrics' text, which
/// Prometheus reads).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    api: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model: String,
}

type ByModel = Family<ModelLabels, Histogram, fn() -> Histogram>;

/// How a job ended, as `zimage_jobs_total`'s `outcome` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Error,
    /// Its client left, or someone stopped it (interrupt, a drain's end).
    Cancelled,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// The API a job came from, read off its log label (`METHOD /path model`): each front end
/// names its route there already, so no front end has to tell the worker again.
pub fn api_of(label: &str) -> &'static str {
    let path = label.split(' ').nth(1).unwrap_or("");
    if path.starts_with("/ui/") {
        "page"
    } else if path.starts_with("/api/") {
        "ollama"
    } else if path.starts_with("/v1/") {
        "openai"
    } else if path.starts_with("/sdapi/") {
        "a1111"
    } else {
        "other"
    }
}

/// The server's metrics and the registry that writes them.
pub struct Metrics {
    registry: Registry,
    queued: Gauge,
    running: Gauge,
    jobs: Family<JobLabels, Counter>,
    generation: ByModel,
    step: ByModel,
    load: ByModel,
    resident: Gauge,
    mlx_active: Gauge,
    mlx_peak: Gauge,
}

// Buckets from 50 ms doubling to about 7 minutes: a tiny model's job on a CPU to a large one's.
fn job_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 14))
}

// From 5 ms to about 80 s a step.
fn step_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let (queued, running, jobs) = (Gauge::default(), Gauge::default(), Family::default());
        let generation: ByModel = Family::new_with_constructor(job_buckets);
        let step: ByModel = Family::new_with_constructor(step_buckets);
        let load: ByModel = Family::new_with_constructor(job_buckets);
        let (resident, mlx_active, mlx_peak) =
            (Gauge::default(), Gauge::default(), Gauge::default());
        let mut registry = Registry::default();
        registry.register(
            "zimage_queue_depth",
            "Jobs waiting for the generation worker (the running one not counted); scale on this",
            queued.clone(),
        );
        registry.register(
            "zimage_running_jobs",
            "Jobs the generation worker runs now (0 or 1)",
            running.clone(),
        );
        registry.register(
            "zimage_jobs",
            "Jobs finished, by the API they came from and how they ended",
            jobs.clone(),
        );
        let seconds = [
            (
                "zimage_generation",
                "Time a job took on the worker, loading included, by model",
                &generation,
            ),
            ("zimage_step", "Time of one denoising step after the first of each pass (the first carries the pass's setup), by model", &step),
            (
                "zimage_model_load",
                "Time to load a model that was not resident, by model",
                &load,
            ),
        ];
        for (name, help, family) in seconds {
            registry.register_with_unit(name, help, Unit::Seconds, family.clone());
        }
        let bytes = [
            (
                "zimage_resident_memory",
                "Memory the process holds resident",
                &resident,
            ),
            (
                "zimage_mlx_active_memory",
                "Memory MLX's live arrays hold, as of the worker's last step or job",
                &mlx_active,
            ),
            (
                "zimage_mlx_peak_memory",
                "MLX's highest memory since the last job started",
                &mlx_peak,
            ),
        ];
        for (name, help, gauge) in bytes {
            registry.register_with_unit(name, help, Unit::Bytes, gauge.clone());
        }
        Metrics {
            registry,
            queued,
            running,
            jobs,
            generation,
            step,
            load,
            resident,
            mlx_active,
            mlx_peak,
        }
    }

    /// A job ended, from the API its label names.
    pub fn finished(&self, label: &str, outcome: Outcome) {
        self.jobs
            .get_or_create(&JobLabels {
                api: api_of(label).into(),
                outcome: outcome.label().into(),
            })
            .inc();
    }

    pub fn generated(&self, model: &str, took: Duration) {
        self.observe(&self.generation, model, took);
    }

    pub fn step(&self, model: &str, took: Duration) {
        self.observe(&self.step, model, took);
    }

    pub fn loaded(&self, model: &str, took: Duration) {
        self.observe(&self.load, model, took);
    }

    fn observe(&self, family: &ByModel, model: &str, took: Duration) {
        family
            .get_or_create(&ModelLabels {
                model: model.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// MLX's memory now; called on the worker thread, which owns MLX.
    pub fn mlx_memory(&self, active: usize, peak: usize) {
        self.mlx_active.set(saturating(active as u64));
        self.mlx_peak.set(saturating(peak as u64));
    }

    /// The exposition, with the gauges read now set first.
    pub fn render(&self, queued: usize, running: bool) -> String {
        self.queued.set(saturating(queued as u64));
        self.running.set(i64::from(running));
        if let Some(bytes) = crate::platform::resident_bytes() {
            self.resident.set(saturating(bytes));
        }
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// `GET /metrics`.
pub async fn page(
    axum::extract::State(state): axum::extract::State<std::sync::Arc<super::AppState>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let worker = &state.worker;
    let text = worker
        .metrics()
        .render(worker.queued(), worker.running().is_some());
    ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response()
}

fn saturating(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_counted_by_api_and_outcome() {
        let m = Metrics::new();
        m.finished("POST /api/generate tiny", Outcome::Ok);
        m.finished("POST /api/generate tiny", Outcome::Ok);
        m.finished("POST /v1/images/generations tiny", Outcome::Error);
        m.finished("POST /ui/api/jobs tiny", Outcome::Cancelled);
        m.generated("tiny", Duration::from_millis(300));
        let text = m.render(3, true);
        assert!(
            text.contains("zimage_jobs_total{api=\"ollama\",outcome=\"ok\"} 2"),
            "{text}"
        );
        assert!(text.contains("zimage_jobs_total{api=\"openai\",outcome=\"error\"} 1"));
        assert!(text.contains("zimage_jobs_total{api=\"page\",outcome=\"cancelled\"} 1"));
        assert!(text.contains("zimage_queue_depth 3"));
        assert!(text.contains("zimage_running_jobs 1"));
        assert!(text.contains("zimage_generation_seconds_count{model=\"tiny\"} 1"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn apis_are_read_off_labels() {
        assert_eq!(api_of("POST /sdapi/v1/txt2img tiny"), "a1111");
        assert_eq!(api_of("POST /v1/images/edits tiny"), "openai");
        assert_eq!(api_of("garbage"), "other");
    }
}
