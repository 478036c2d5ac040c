//! Progress, interrupt and skip over the worker's running job, whichever API sent it.

use crate::generation;
use crate::server::AppState;
use axum::extract::{RawQuery, State};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

/// `GET /sdapi/v1/progress`: the worker's running job, whichever API sent it, with the latest
/// step's preview as `current_image` (a base64 PNG) when the job draws previews and the query
/// does not say `skip_current_image=true`.
pub async fn progress(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Json<Value> {
    let skip_image = query
        .as_deref()
        .is_some_and(|q| q.split('&').any(|pair| pair == "skip_current_image=true"));
    let running = state.worker.running();
    let job_count = state.worker.queued() + usize::from(running.is_some());
    let Some(r) = running else {
        return Json(json!({
            "progress": 0.0,
            "eta_relative": 0.0,
            "state": {
                "skipped": false, "interrupted": false, "stopping_generation": false,
                "job": "", "job_count": job_count, "job_timestamp": "0", "job_no": 0,
                "sampling_step": 0, "sampling_steps": 0,
            },
            "current_image": null,
            "textinfo": null,
        }));
    };
    let p = r.progress.as_ref();
    let fraction = p.map_or(0.0, generation::Progress::fraction);
    let elapsed = p.map_or(0.0, |p| p.elapsed.as_secs_f64());
    let eta = if fraction > 0.0 {
        elapsed / fraction - elapsed
    } else {
        0.0
    };
    Json(json!({
        "progress": fraction,
        "eta_relative": eta,
        "state": {
            "skipped": false,
            "interrupted": r.interrupted(),
            "stopping_generation": false,
            "job": r.label,
            "job_count": job_count,
            "job_timestamp": crate::server::compact_time(r.started),
            "job_no": p.map_or(0, |p| p.image.saturating_sub(1)),
            "sampling_step": p.map_or(0, |p| p.step),
            "sampling_steps": p.map_or(0, |p| p.steps),
        },
        "current_image": p
            .and_then(|p| p.preview.as_ref())
            .filter(|_| !skip_image)
            .map(|preview| preview.png_base64()),
        "textinfo": p.map(|p| format!("{}: image {} of {}, step {} of {}", p.phase, p.image, p.images, p.step, p.steps)),
    }))
}

/// `POST /sdapi/v1/interrupt`: stops the running job at its next step; its request is answered
/// 409 without images.
pub async fn interrupt(State(state): State<Arc<AppState>>) -> Json<Value> {
    state.worker.interrupt();
    Json(json!({}))
}

/// `POST /sdapi/v1/skip`: as A1111, the current image of the running job stops at its next
/// step and the batch goes on with the next; the skipped image is left out of the answer.
pub async fn skip(State(state): State<Arc<AppState>>) -> Json<Value> {
    state.worker.skip();
    Json(json!({}))
}
