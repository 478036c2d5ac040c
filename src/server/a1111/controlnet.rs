//! The ControlNet extension's units (`alwayson_scripts.controlnet.args`) read into zimage's
//! one ControlNet, as far as they map cleanly: one enabled unit, a stored ControlNet, a
//! prepared control image (no preprocessor), its weight as the scale, over the whole schedule.
//! Anything else is refused with what to send instead, never changed silently.

use super::{bad, API};
use crate::generation::{self, ControlJob};
use crate::server::errors::ApiError;
use crate::server::AppState;
use serde_json::Value;

/// The extension's API version its clients check before they send units.
pub const VERSION: u32 = 2;

/// The control job of a body's `alwayson_scripts`, if a ControlNet unit is enabled.
/// `size`: the job's width and height when it names them.
pub fn unit(
    state: &AppState,
    scripts: Option<&serde_json::Map<String, Value>>,
    size: (Option<u32>, Option<u32>),
) -> Result<Option<ControlJob>, ApiError> {
    // A1111 finds scripts by name in any case; webuiapi sends `ControlNet`.
    let script = scripts.and_then(|s| {
        s.iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("controlnet"))
            .map(|(_, v)| v)
    });
    let Some(script) = script else {
        return Ok(None);
    };
    let units = match &script["args"] {
        Value::Null => return Ok(None),
        Value::Array(units) => units,
        other => {
            return Err(bad(format!(
                "field `alwayson_scripts.controlnet.args` is {}; give a list of units",
                kind(other)
            )))
        }
    };
    let enabled: Vec<(usize, &Value)> = units
        .iter()
        .enumerate()
        .filter(|(_, u)| u.is_object() && u["enabled"] != Value::Bool(false))
        .collect();
    let (i, u) = match enabled.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        more => {
            return Err(bad(format!(
                "field `alwayson_scripts.controlnet.args`: {} units are enabled; zimage steers with one ControlNet at a time",
                more.len()
            )))
        }
    };
    let field = |name: &str| format!("alwayson_scripts.controlnet.args[{i}].{name}");
    let text = |name: &str| u[name].as_str().unwrap_or("");
    let module = text("module");
    if !(module.is_empty() || module.eq_ignore_ascii_case("none")) {
        return Err(bad(format!(
            "field `{}` is `{}`: zimage runs no preprocessors; send the prepared control image (pose, edges, depth) with module `none`",
            field("module"),
            module.escape_debug()
        )));
    }
    // The extension lists models as `name [hash]`; the name is the stored ControlNet's.
    let model = text("model");
    let name = model.split(" [").next().unwrap_or("").trim();
    if name.is_empty() || name.eq_ignore_ascii_case("none") {
        return Err(bad(format!(
            "field `{}` is empty: name a stored ControlNet (GET /controlnet/model_list lists them)",
            field("model")
        )));
    }
    for (key, neutral) in [("guidance_start", 0.0), ("guidance_end", 1.0)] {
        if let Some(v) = u[key].as_f64().filter(|v| *v != neutral) {
            return Err(bad(format!(
                "field `{}` is {v}: zimage's ControlNet steers every step; send {neutral}",
                field(key)
            )));
        }
    }
    match &u["control_mode"] {
        Value::Null => {}
        Value::Number(n) if n.as_i64() == Some(0) => {}
        Value::String(s) if s == "Balanced" => {}
        other => {
            return Err(bad(format!(
                "field `{}` is {other}: zimage has the balanced mode alone; send `Balanced` (0)",
                field("control_mode")
            )))
        }
    }
    let (image, mask) = match &u["image"] {
        // Older versions of the extension take `input_image`, or the image and its mask together.
        Value::Null | Value::String(_) if u["input_image"].is_string() => {
            (text("input_image"), &u["mask"])
        }
        Value::String(s) => (s.as_str(), &u["mask"]),
        Value::Object(o) => (
            o.get("image").and_then(Value::as_str).unwrap_or(""),
            o.get("mask").unwrap_or(&Value::Null),
        ),
        _ => ("", &Value::Null),
    };
    if image.is_empty() {
        return Err(bad(format!(
            "field `{}` is empty: send the control image (base64) the ControlNet follows",
            field("image")
        )));
    }
    if !(mask.is_null() || mask.as_str() == Some("")) {
        return Err(bad(format!(
            "field `{}`: zimage's ControlNet takes no mask; leave it out",
            field("mask")
        )));
    }
    let bytes = crate::server::base64_field(API, &field("image"), image)?;
    let scale = u["weight"].as_f64().map(|w| w as f32);
    let name = crate::store::ModelName::parse(name)
        .map_err(|e| bad(format!("field `{}`: {e}", field("model"))))?;
    let job = crate::server::control_job(
        &state.store,
        API,
        Some(&name.to_string()),
        Some(&bytes),
        scale.or(Some(generation::DEFAULT_CONTROL_SCALE)),
    )?
    .map(|mut job| {
        job.image.label = format!("field `{}`", field("image"));
        job
    });
    if let Some(job) = &job {
        check_resize(&field("resize_mode"), &u["resize_mode"], job, size)?;
    }
    Ok(job)
}

/// The control image is stretched to the image's size (the extension's `Just Resize`). The
/// other modes crop or pad, which differs only when the two aspect ratios differ; then they
/// are refused.
fn check_resize(
    field: &str,
    mode: &Value,
    job: &ControlJob,
    size: (Option<u32>, Option<u32>),
) -> Result<(), ApiError> {
    let stretches = match mode {
        Value::Null => true,
        Value::Number(n) => n.as_i64() == Some(0),
        Value::String(s) => s.eq_ignore_ascii_case("Just Resize"),
        _ => false,
    };
    let (w, h) = (job.image.image.width(), job.image.image.height());
    let (Some(out_w), Some(out_h)) = size else {
        // Without a size the image takes the control image's own shape.
        return Ok(());
    };
    // Within a pixel of the output's shape: rounding to the size multiple changes nothing seen.
    let same_shape = (u64::from(w) * u64::from(out_h)).abs_diff(u64::from(h) * u64::from(out_w))
        <= u64::from(out_w.max(out_h));
    if stretches || same_shape {
        return Ok(());
    }
    Err(bad(format!(
        "field `{field}` is {mode}: the control image is {w}×{h}, another shape than the {out_w}×{out_h} asked for, and zimage stretches it (`Just Resize`) rather than crop or pad; send `Just Resize`, or a control image of the image's shape"
    )))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
