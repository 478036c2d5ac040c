//! The page's gallery: every image the page made, kept as a PNG (with its generation metadata)
//! in one folder, and listed back from those files alone, so a restart loses nothing and a
//! file copied in from `zimage generate` shows up too.

use crate::generation::Image;
use crate::store::ModelName;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The most images a listing returns (the newest).
pub const MAX_LISTED: usize = 500;

/// The gallery's folder.
#[derive(Debug, Clone)]
pub struct Gallery {
    pub dir: PathBuf,
}

/// A file name the gallery serves: its own names only, so a request reads nothing else.
pub fn valid_name(name: &str) -> bool {
    name.len() <= 128
        && name.ends_with(".png")
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl Gallery {
    pub fn new(dir: PathBuf) -> Gallery {
        Gallery { dir }
    }

    /// Writes a job's images, each atomically (a crash leaves no half file), named by the
    /// time, the job and the image's place in it; returns the names in order.
    pub fn save(&self, job: u64, images: &[Image]) -> Result<Vec<String>, String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| {
            format!(
                "cannot make the gallery folder `{}`: {e}",
                self.dir.display()
            )
        })?;
        let stamp = crate::server::compact_time(SystemTime::now());
        images
            .iter()
            .enumerate()
            .map(|(k, image)| {
                let name = format!("{}-{}-{job}-{}.png", &stamp[..8], &stamp[8..], k + 1);
                let path = self.dir.join(&name);
                crate::files::write_output(&path, &image.png)
                    .map_err(|e| format!("cannot keep the image in the gallery: {e}"))?;
                Ok(name)
            })
            .collect()
    }

    /// The entries of the folder, newest first, at most [`MAX_LISTED`].
    pub fn list(&self, lora_dir: Option<&Path>) -> Vec<Value> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut files: Vec<(SystemTime, String)> = dir
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let meta = e.metadata().ok()?;
                (valid_name(&name) && meta.is_file())
                    .then(|| (meta.modified().unwrap_or(UNIX_EPOCH), name))
            })
            .collect();
        // Names begin with the time, so they break ties between files of one second.
        files.sort_by(|a, b| b.cmp(a));
        files.truncate(MAX_LISTED);
        files
            .into_iter()
            .filter_map(|(modified, name)| self.entry(&name, modified, lora_dir))
            .collect()
    }

    /// One image's entry: its size, its infotext, and the settings that made it as the page's
    /// form takes them.
    pub fn entry(
        &self,
        name: &str,
        modified: SystemTime,
        lora_dir: Option<&Path>,
    ) -> Option<Value> {
        let path = self.dir.join(name);
        let texts = crate::image_out::read_png_text(&path).ok()?;
        let text = |key: &str| texts.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let (width, height) = image::image_dimensions(&path).ok()?;
        let recorded = text("zimage").and_then(|t| serde_json::from_str::<Value>(&t).ok());
        Some(json!({
            "file": name,
            "url": format!("/ui/gallery/{name}"),
            "created": modified.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            "width": width,
            "height": height,
            "parameters": text("parameters").unwrap_or_default(),
            "settings": recorded.map_or(Value::Null, |r| settings(&r, lora_dir)),
        }))
    }

    /// One image's bytes; `None` unless `name` is a regular file of the folder. A link is not
    /// followed (it could lead anywhere), and a FIFO or device is not opened (a read could
    /// block a thread for good).
    pub fn read(&self, name: &str) -> Option<Vec<u8>> {
        use std::io::Read;
        let path = self.dir.join(name);
        let mut file =
            crate::files::open_regular_here(&path, std::fs::OpenOptions::new().read(true)).ok()?;
        let meta = file.metadata().ok()?;
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut bytes).ok()?;
        Some(bytes)
    }

    /// Removes one image; whether it was there (a regular file: a link, a folder or anything
    /// else of that name is not the gallery's and is left alone).
    pub fn delete(&self, name: &str) -> std::io::Result<bool> {
        let path = self.dir.join(name);
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            return Ok(false);
        }
        match std::fs::remove_file(path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// The form's settings from the request JSON a PNG records (its `zimage` chunk). A hires
/// image records its first pass, which is what the form asks for.
fn settings(recorded: &Value, lora_dir: Option<&Path>) -> Value {
    let request = &recorded["request"];
    let model = recorded["model"]
        .as_str()
        .and_then(|m| ModelName::parse(m).ok())
        .map(|m| m.short());
    // A LoRA is named to the server by its place in the LoRA folder.
    let loras: Vec<Value> = recorded["loras"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter_map(|l| {
                    let file = Path::new(l["file"].as_str()?);
                    let relative = file.strip_prefix(lora_dir?).ok()?;
                    Some(json!({ "path": relative.to_str()?, "scale": single(&l["scale"]) }))
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "model": model,
        "prompt": request["prompt"],
        "negative_prompt": request["negative_prompt"],
        "width": request["width"],
        "height": request["height"],
        "steps": request["steps"],
        "guidance": single(&request["guidance"]),
        "seed": request["seed"],
        "cfg_normalization": request["cfg_normalization"],
        "cfg_truncation": request["cfg_truncation"],
        "strength": request["input"]["strength"],
        "inpaint": request["input"]["inpaint"],
        "loras": loras,
        "controlnet": recorded["control"]["controlnet"],
        "control_scale": single(&recorded["control"]["scale"]),
        "hires": recorded["hires"],
        "only_masked": recorded["only_masked"]["padding"],
    })
}

/// A recorded single-precision number as it was asked for (0.6, not 0.6000000238418579):
/// its shortest decimal as an `f32`.
fn single(v: &Value) -> Value {
    v.as_f64()
        .and_then(|x| (x as f32).to_string().parse::<f64>().ok())
        .map_or(Value::Null, |x| json!(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_gallery_names_are_served() {
        assert!(valid_name("20261126-101500-17-1.png"));
        assert!(!valid_name("../store/blobs.png"));
        assert!(!valid_name(".hidden.png"));
        assert!(!valid_name("a/b.png"));
        assert!(!valid_name("image.jpg"));
    }

    #[test]
    fn settings_come_from_the_recorded_request() {
        let recorded = json!({
            "request": {"prompt": "a fox", "negative_prompt": null, "width": 64, "height": 48,
                        "steps": 8, "guidance": 0.0, "seed": 7, "cfg_normalization": false,
                        "cfg_truncation": 1.0, "input": {"inpaint": true, "strength": 0.8}},
            "model": "registry.ollama.ai/library/tiny:latest",
            "loras": [{"file": "/loras/sub/style.safetensors", "scale": 0.5},
                      {"file": "/elsewhere/x.safetensors", "scale": 1.0}],
        });
        let s = settings(&recorded, Some(Path::new("/loras")));
        assert_eq!(s["model"], "tiny");
        assert_eq!(s["seed"], 7);
        assert_eq!(s["strength"], 0.8);
        assert_eq!(
            s["loras"],
            json!([{"path": "sub/style.safetensors", "scale": 0.5}])
        );
        assert_eq!(s["controlnet"], Value::Null);
    }
}
