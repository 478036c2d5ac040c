//! The ControlNet extension's units (`alwayson_scripts.controlnet.args`) read into zimage's
//! one ControlNet, as far as they map cleanly: one enabled unit, a stored ControlNet, a
//! prepared control image (no preprocessor), its weight as the scale, over the whole schedule.
//! Anything else is refused with what to send instead, never changed silently.

use super::{bad, API};
use crate::generation::{self, ControlJob};
use crate::server::errors::ApiError;
use serde_json::Value;

/// The extension's API version its clients check before they send units.
pub const VERSION: u32 = 2;

/// An enabled ControlNet unit, checked, with its control image's bytes (base64 undone, not yet
/// decoded: the server admits them to its input budget first).
pub struct UnitRequest {
    /// `alwayson_scripts.controlnet.args[i].image`, for messages.
    pub field: String,
    pub bytes: Vec<u8>,
    net: crate::store::ModelName,
    scale: f32,
    /// The unit's `resize_mode`, and its field's name.
    resize_mode: (String, Value),
}

/// The enabled ControlNet unit of a body's `alwayson_scripts`, if there is one. Every field is
/// checked here, its JSON type too: a value of the wrong type is refused, never taken as unset.
pub fn unit(
    scripts: Option<&serde_json::Map<String, Value>>,
) -> Result<Option<UnitRequest>, ApiError> {
    // A1111 finds scripts by name in any case; webuiapi sends `ControlNet`.
    let script = scripts.and_then(|s| {
        s.iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("controlnet"))
    });
    let Some((script_name, script)) = script else {
        return Ok(None);
    };
    let script_field = format!("alwayson_scripts.{}", script_name.escape_debug());
    let units = match typed(
        script,
        "args",
        &format!("{script_field}.args"),
        "a list of units",
        Value::as_array,
    )? {
        None => return Ok(None),
        Some(units) => units,
    };
    let mut enabled = Vec::new();
    for (i, u) in units.iter().enumerate() {
        let field = format!("{script_field}.args[{i}]");
        if !u.is_object() {
            return Err(bad(format!(
                "field `{field}` is {}; give a unit (a JSON object)",
                kind(u)
            )));
        }
        if typed(
            u,
            "enabled",
            &format!("{field}.enabled"),
            "true or false",
            Value::as_bool,
        )? != Some(false)
        {
            enabled.push((i, u));
        }
    }
    let (i, u) = match enabled.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        more => {
            return Err(bad(format!(
                "field `{script_field}.args`: {} units are enabled; zimage steers with one ControlNet at a time",
                more.len()
            )))
        }
    };
    let field = |name: &str| format!("{script_field}.args[{i}].{name}");
    let text = |name: &str| {
        typed(u, name, &field(name), "a string", Value::as_str).map(Option::unwrap_or_default)
    };
    let module = text("module")?;
    if !(module.is_empty() || module.eq_ignore_ascii_case("none")) {
        return Err(bad(format!(
            "field `{}` is `{}`: zimage runs no preprocessors; send the prepared control image (pose, edges, depth) with module `none`",
            field("module"),
            module.escape_debug()
        )));
    }
    // The extension lists models as `name [hash]`; the name is the stored ControlNet's.
    let model = text("model")?;
    let name = model.split(" [").next().unwrap_or("").trim();
    if name.is_empty() || name.eq_ignore_ascii_case("none") {
        return Err(bad(format!(
            "field `{}` is empty: name a stored ControlNet (GET /controlnet/model_list lists them)",
            field("model")
        )));
    }
    for (key, neutral) in [("guidance_start", 0.0), ("guidance_end", 1.0)] {
        let value = typed(u, key, &field(key), "a number", Value::as_f64)?;
        if let Some(v) = value.filter(|v| *v != neutral) {
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
    let input_image = typed(
        u,
        "input_image",
        &field("input_image"),
        "a string (base64)",
        Value::as_str,
    )?;
    let (image, mask) = match (&u["image"], input_image) {
        // Older versions of the extension take `input_image`, or the image and its mask together.
        (Value::Null | Value::String(_), Some(input)) => (input, &u["mask"]),
        (Value::String(s), None) => (s.as_str(), &u["mask"]),
        (Value::Object(o), _) => (
            o.get("image").and_then(Value::as_str).unwrap_or(""),
            o.get("mask").unwrap_or(&Value::Null),
        ),
        (Value::Null, None) => ("", &Value::Null),
        (other, _) => {
            return Err(bad(format!(
                "field `{}` is {}; give the control image as base64",
                field("image"),
                kind(other)
            )))
        }
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
    let weight = typed(u, "weight", &field("weight"), "a number", Value::as_f64)?;
    let scale = weight.map_or(generation::DEFAULT_CONTROL_SCALE, |w| w as f32);
    if let Some(e) = generation::control_scale_error(scale) {
        return Err(bad(e.replace(
            "--control-scale",
            &format!("field `{}`", field("weight")),
        )));
    }
    let net = crate::store::ModelName::parse(name)
        .map_err(|e| bad(format!("field `{}`: {e}", field("model"))))?;
    let resize_mode = u["resize_mode"].clone();
    if !matches!(
        resize_mode,
        Value::Null | Value::Number(_) | Value::String(_)
    ) {
        return Err(bad(format!(
            "field `{}` is {}; give a number or a mode's name (`Just Resize`)",
            field("resize_mode"),
            kind(&resize_mode)
        )));
    }
    Ok(Some(UnitRequest {
        bytes: crate::server::base64_field(API, &field("image"), image)?,
        field: field("image"),
        net,
        scale,
        resize_mode: (field("resize_mode"), resize_mode),
    }))
}

impl UnitRequest {
    /// The control job: the image decoded (off the async threads) and its shape checked against
    /// the job's `size` when the job names one.
    pub fn decode(
        &self,
        store: &crate::store::Store,
        size: (Option<u32>, Option<u32>),
    ) -> Result<ControlJob, ApiError> {
        let job = crate::server::control_job(
            store,
            API,
            Some(&self.net.to_string()),
            Some(&self.bytes),
            Some(self.scale),
        )?;
        let Some(mut job) = job else {
            return Err(bad(format!("field `{}` is empty", self.field)));
        };
        job.image.label = format!("field `{}`", self.field);
        let (mode_field, mode) = &self.resize_mode;
        check_resize(mode_field, mode, &job, size)?;
        Ok(job)
    }
}

/// A unit's field `key` as `read` takes it (`field` names it in messages): `None` when it is
/// absent or null, a 400 naming the field when it is of another JSON type.
fn typed<'a, T>(
    unit: &'a Value,
    key: &str,
    field: &str,
    wanted: &str,
    read: fn(&'a Value) -> Option<T>,
) -> Result<Option<T>, ApiError> {
    match unit.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => read(v)
            .map(Some)
            .ok_or_else(|| bad(format!("field `{field}` is {}; give {wanted}", kind(v)))),
    }
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

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
