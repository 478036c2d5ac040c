//! What the fuzz targets share: one scratch folder per process for the readers that take a
//! path, and a throwaway model store.
//!
//! The folder lives in `$ZIMAGE_FUZZ_TMPDIR`, else `/dev/shm` (no disk writes at tens of
//! thousands of inputs a second), else the system temp folder, and is removed when the fuzzer
//! exits normally. A crashing run leaves it behind so the failing file can be looked at.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static SCRATCH: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn remove_scratch() {
    if let Some(dir) = SCRATCH.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// This process's scratch folder, created on first use.
pub fn scratch_dir() -> &'static Path {
    SCRATCH.get_or_init(|| {
        let base = std::env::var_os("ZIMAGE_FUZZ_TMPDIR")
            .map(PathBuf::from)
            .or_else(|| Some(PathBuf::from("/dev/shm")).filter(|p| p.is_dir()))
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("zimage-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch folder can be created");
        // SAFETY: `remove_scratch` is a plain `extern "C" fn()` that only touches the
        // initialised `SCRATCH`; registering it has no other effect.
        unsafe { libc::atexit(remove_scratch) };
        dir
    })
}

/// Writes `bytes` to `name` in the scratch folder (the same path for every input) and
/// returns the path.
pub fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch_dir().join(name);
    std::fs::write(&path, bytes).expect("scratch file can be written");
    path
}

/// An empty store folder in the scratch folder, emptied of the previous input's files.
///
/// The folders are kept and only the files the last input left are removed: making and
/// removing the folder tree was most of the time an input took.
pub fn fresh_store() -> PathBuf {
    let root = scratch_dir().join("store");
    let blobs = root.join("blobs");
    if blobs.is_dir() {
        let manifests = root.join("manifests");
        for entry in std::fs::read_dir(&root).expect("store folder can be read") {
            let path = entry.expect("store folder can be read").path();
            if path == blobs {
                empty_folder(&blobs);
            } else if path == manifests {
                let _ = std::fs::remove_file(manifests.join(manifest_rel()));
            } else if path.is_dir() {
                let _ = std::fs::remove_dir_all(&path);
            } else if path.file_name().is_some_and(|n| n != ".zimage-lock") {
                let _ = std::fs::remove_file(&path);
            }
        }
    } else {
        std::fs::create_dir_all(&blobs).expect("store folder can be created");
    }
    root
}

fn empty_folder(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("blobs folder can be read") {
        let path = entry.expect("blobs folder can be read").path();
        if path.is_dir() {
            let _ = std::fs::remove_dir_all(&path);
        } else {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Where `m`'s manifest lies below `manifests/`.
fn manifest_rel() -> PathBuf {
    let name = zimage::store::ModelName::parse("m").expect("`m` is a valid name");
    name.manifest_path()
        .strip_prefix("manifests")
        .expect("manifest paths start with manifests/")
        .to_path_buf()
}

/// Puts `bytes` in the store as a blob, the way the store names it, without the fsync of the
/// real writer (nothing here must survive a power cut). Returns the digest.
pub fn put_blob(root: &Path, bytes: &[u8]) -> String {
    let digest = format!("sha256:{:x}", Sha256::digest(bytes));
    let path = zimage::store::blob::blob_path(root, &digest).expect("digests we make are valid");
    std::fs::write(path, bytes).expect("blob can be written");
    digest
}

/// Puts `bytes` where the store looks for the manifest of `m` (`registry.ollama.ai/library/m:latest`).
pub fn put_manifest(root: &Path, bytes: &[u8]) {
    let name = zimage::store::ModelName::parse("m").expect("`m` is a valid name");
    let path = root.join(name.manifest_path());
    std::fs::create_dir_all(path.parent().expect("manifest paths have parents"))
        .expect("manifest folder can be created");
    std::fs::write(path, bytes).expect("manifest can be written");
}

const BLOB_SEPARATOR: &[u8] = b"@@BLOB@@";

/// A one-model store built from a blob-classification input: one mode byte, then up to three
/// blobs separated by `@@BLOB@@`, given in turn to the layers the mode names (cycling when
/// there are fewer blobs than layers).
/// - bits 0-1: the layers of component `c`: `w`; `w`, `w_scale`, `w_qbias` (v1 quantized);
///   `w`, `w_scale` (a scale without its bias); `w_qbias` alone;
/// - bit 2: layers state the dtype and shape of their blob's first tensor, as we write them;
/// - bit 3: read through a memory map instead of MLX's loader.
///
/// Returns the store, its model `m`, and the read path; `None` for an empty input.
pub fn blob_store(
    data: &[u8],
) -> Option<(
    zimage::store::Store,
    zimage::store::StoredModel,
    zimage::loader::ReadPath,
)> {
    use zimage::store::manifest::{self, Layer, Manifest, TENSOR_MEDIA_TYPE};
    let (&mode, rest) = data.split_first()?;
    let blobs = split_blobs(rest);
    let names: &[&str] = match mode & 3 {
        0 => &["w"],
        1 => &["w", "w_scale", "w_qbias"],
        2 => &["w", "w_scale"],
        _ => &["w_qbias"],
    };
    let declare = mode & 4 != 0;
    let read_path = if mode & 8 != 0 {
        zimage::loader::ReadPath::Mmap
    } else {
        zimage::loader::ReadPath::MlxLoader
    };

    let root = fresh_store();
    let config = manifest::config_blob("bf16");
    let config = Layer {
        media_type: manifest::CONFIG_MEDIA_TYPE.into(),
        digest: put_blob(&root, &config),
        size: config.len() as u64,
        from: None,
        name: None,
        dtype: None,
        shape: None,
    };
    let layers = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let bytes = blobs[i % blobs.len()];
            let first = zimage::safetensors::parse(bytes)
                .ok()
                .and_then(|h| h.tensors.into_iter().next())
                .filter(|_| declare);
            Layer {
                media_type: TENSOR_MEDIA_TYPE.into(),
                digest: put_blob(&root, bytes),
                size: bytes.len() as u64,
                from: None,
                name: Some(format!("c/{name}")),
                dtype: first.as_ref().map(|t| t.dtype.name().to_string()),
                shape: first.map(|t| t.shape),
            }
        })
        .collect();
    let m = Manifest::new(config, layers);
    put_manifest(&root, &m.to_bytes());

    let store = zimage::store::Store::at(&root);
    let model = store.open("m").expect("the manifest we wrote opens");
    assert_eq!(
        model.name,
        zimage::store::ModelName::parse("m").expect("`m` is a valid name")
    );
    Some((store, model, read_path))
}

fn split_blobs(mut rest: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while out.len() < 2 {
        let Some(at) = rest
            .windows(BLOB_SEPARATOR.len())
            .position(|w| w == BLOB_SEPARATOR)
        else {
            break;
        };
        out.push(&rest[..at]);
        rest = &rest[at + BLOB_SEPARATOR.len()..];
    }
    out.push(rest);
    out
}

/// One single-threaded async runtime per process, for the targets that drive the server's
/// async body readers.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime starts")
    })
}
