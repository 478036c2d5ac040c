//! The demo model, inside the binary: a `zimage` installed anywhere runs it with no source tree.
//! Its files are unpacked once into the cache, under a name that changes with their content.

use anyhow::Context;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

use zimage::embedded::DEMO_FILES;

/// The demo model as a diffusers directory in `cache`, unpacked on first use.
pub fn unpacked(cache: &Path) -> anyhow::Result<PathBuf> {
    let mut h = Sha256::new();
    for (path, bytes) in DEMO_FILES {
        h.update(path.as_bytes());
        h.update([0]);
        h.update(bytes);
    }
    let id = format!("{:x}", h.finalize());
    let dir = cache.join(format!("demo-model-{}", &id[..12]));
    if dir.join("model_index.json").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(cache)
        .with_context(|| format!("cannot create the cache `{}`", cache.display()))?;
    // Unpacked beside its final name and renamed, so no half-written model is ever found.
    let tmp = tempfile::Builder::new()
        .prefix(".demo-model-")
        .tempdir_in(cache)
        .with_context(|| format!("cannot write to the cache `{}`", cache.display()))?;
    for (path, bytes) in DEMO_FILES {
        let dest = tmp.path().join(path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&dest, bytes).with_context(|| format!("writing `{}`", dest.display()))?;
    }
    match std::fs::rename(tmp.path(), &dir) {
        Ok(()) => {
            // The folder now lives at its final name; nothing is left to clean up.
            let _ = tmp.keep();
        }
        // Another process unpacked it first; the temporary copy goes with `tmp`.
        Err(_) if dir.join("model_index.json").is_file() => {}
        Err(e) => {
            return Err(e).with_context(|| format!("unpacking the demo into `{}`", dir.display()))
        }
    }
    Ok(dir)
}
