//! The ControlNet forward against diffusers 0.42.1 on the demo model (f32), the plain forward at
//! scale 0, and recognising the published single files from their tensors.

mod common;

use common::controlnet::{tiny_config, tiny_tensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use zimage::diffusers_dir::DiffusersDir;
use zimage::families::zimage::Pipeline;
use zimage::families::zimage::{ControlNet, ControlNetVersion, ZImageTransformer};
use zimage::mlx::{io, Array, Dtype};
use zimage::models::Checkpoint;

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models")
}

fn transformer() -> ZImageTransformer {
    let dir = DiffusersDir::open(&models().join("z-image-tiny")).unwrap();
    Pipeline::new(dir, Dtype::F32, true)
        .unwrap()
        .load_transformer()
        .unwrap()
}

fn tiny_controlnet(layout: &str, transformer: &ZImageTransformer) -> ControlNet {
    let cfg = tiny_config(layout);
    let ckpt = Checkpoint::new("controlnet", tiny_tensors(&cfg), Dtype::F32);
    ControlNet::new(&cfg, ckpt, &transformer.config).unwrap()
}

struct Forward {
    t: HashMap<String, Array>,
    t_model: f32,
    scale: f32,
}

fn reference(layout: &str) -> Forward {
    let path = models().join(format!("reference/controlnet-{layout}-forward.safetensors"));
    let st = io::load_safetensors(&path).unwrap();
    let case: serde_json::Value = serde_json::from_str(&st.metadata["case"]).unwrap();
    Forward {
        t: st.tensors,
        t_model: case["t"].as_f64().unwrap() as f32,
        scale: case["scale"].as_f64().unwrap() as f32,
    }
}

fn values(a: &Array) -> Vec<f32> {
    a.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap()
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Hints and the controlled output at the reference's scale, each within `tol` of diffusers';
/// returns the largest differences (hints, output).
fn check_forward(layout: &str, tol: f32) -> (f32, f32) {
    let r = reference(layout);
    let tr = transformer();
    let cn = tiny_controlnet(layout, &tr);
    let (latents, caption, control) = (&r.t["latents"], &r.t["caption"], &r.t["control"]);
    let prepared = tr.prepare(&latents.shape(), caption).unwrap();
    let hints = cn
        .hints(&tr, &prepared, latents, control, r.t_model, r.scale)
        .unwrap();
    let mut expected: Vec<usize> = (r.t.keys())
        .filter_map(|k| k.strip_prefix("hint.").map(|i| i.parse().unwrap()))
        .collect();
    expected.sort();
    assert_eq!(hints.layers(), expected, "{layout}: hinted layers");
    let mut hint_diff = 0.0f32;
    for layer in expected {
        let want = values(&r.t[&format!("hint.{layer}")]);
        let got = values(hints.after(layer).unwrap());
        hint_diff = hint_diff.max(max_abs(&got, &want));
    }
    let out = tr
        .forward_prepared_with(latents, r.t_model, &prepared, Some(&hints))
        .unwrap();
    let out_diff = max_abs(&values(&out), &values(&r.t["output"]));
    let plain = tr.forward_prepared(latents, r.t_model, &prepared).unwrap();
    let plain_diff = max_abs(&values(&plain), &values(&r.t["plain"]));
    eprintln!(
        "{layout}: max |Δ| hints {hint_diff:.2e}, output {out_diff:.2e}, plain {plain_diff:.2e}"
    );
    assert!(hint_diff <= tol, "{layout}: hints off by {hint_diff}");
    assert!(
        out_diff <= tol,
        "{layout}: controlled output off by {out_diff}"
    );
    assert!(
        plain_diff <= tol,
        "{layout}: plain output off by {plain_diff}"
    );
    // The control moves the output far beyond the tolerance: the test sees it.
    let moved = max_abs(&values(&r.t["output"]), &values(&r.t["plain"]));
    assert!(
        moved > 100.0 * tol,
        "{layout}: the control barely moves the output ({moved})"
    );
    (hint_diff, out_diff)
}

#[test]
fn controlnet_2_1_forward_matches_diffusers() {
    check_forward("2.1", 1e-4);
}

#[test]
fn controlnet_2_0_forward_matches_diffusers() {
    check_forward("2.0", 1e-4);
}

#[test]
fn controlnet_1_0_forward_matches_diffusers() {
    check_forward("1.0", 1e-4);
}

/// The transformer's output on the 2.1 reference's inputs, steered by `cn` at the reference's
/// scale.
fn output_with(tr: &ZImageTransformer, cn: &ControlNet) -> Vec<f32> {
    let r = reference("2.1");
    let (latents, caption, control) = (&r.t["latents"], &r.t["caption"], &r.t["control"]);
    let prepared = tr.prepare(&latents.shape(), caption).unwrap();
    let hints = cn
        .hints(tr, &prepared, latents, control, r.t_model, r.scale)
        .unwrap();
    values(
        &tr.forward_prepared_with(latents, r.t_model, &prepared, Some(&hints))
            .unwrap(),
    )
}

#[test]
fn scale_zero_gives_the_plain_output_exactly() {
    let r = reference("2.1");
    let tr = transformer();
    let (latents, caption, control) = (&r.t["latents"], &r.t["caption"], &r.t["control"]);
    let prepared = tr.prepare(&latents.shape(), caption).unwrap();
    let plain = values(&tr.forward_prepared(latents, r.t_model, &prepared).unwrap());
    for layout in ["2.1", "1.0"] {
        let cn = tiny_controlnet(layout, &tr);
        let hints = cn
            .hints(&tr, &prepared, latents, control, r.t_model, 0.0)
            .unwrap();
        let out = tr
            .forward_prepared_with(latents, r.t_model, &prepared, Some(&hints))
            .unwrap();
        assert_eq!(values(&out), plain, "{layout}: scale 0 changed the output");
    }
}

#[test]
fn a_diffusers_directory_loads_and_matches_diffusers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("controlnet");
    common::controlnet::write_tiny_dir("2.1", &dir);
    let source = zimage::families::zimage::controlnet_source::ControlNetSource::open(&dir).unwrap();
    assert_eq!(source.version(), ControlNetVersion::V2_1);
    assert_eq!(source.config, tiny_config("2.1"));
    let tr = transformer();
    let cn = source
        .load(&tr.config, Dtype::F32, zimage::models::Residency::Compute)
        .unwrap();
    let diff = max_abs(
        &output_with(&tr, &cn),
        &values(&reference("2.1").t["output"]),
    );
    assert!(diff <= 1e-4, "output off by {diff}");
}

#[test]
fn a_controlnet_that_does_not_fit_the_model_is_refused() {
    let tr = transformer();
    let mut cfg = tiny_config("2.1");
    cfg.control_layers_places = vec![0, 2];
    let ckpt = Checkpoint::new("controlnet", tiny_tensors(&tiny_config("2.1")), Dtype::F32);
    let err = ControlNet::new(&cfg, ckpt, &tr.config).err().unwrap();
    assert!(
        err.to_string()
            .contains("transformer layers [0, 2]; the model has 2"),
        "{err}"
    );
}

/// Writes a single file with the tensors of a published version at the real widths, in bf16,
/// without allocating them: the data area is a hole (zeros) except the first refiner
/// `before_proj`, which 2.1 has random.
fn write_published(path: &Path, version: ControlNetVersion) {
    use std::io::{Seek, SeekFrom, Write};
    use zimage::safetensors::{header_bytes, TensorSpec};
    let layout = match version {
        // 2.0 files carry the refiner blocks of 2.1, their projections zero.
        ControlNetVersion::V2_0 => ControlNetVersion::V2_1,
        v => v,
    };
    let shapes = common::controlnet::tensor_shapes(&layout.published_config());
    let specs: Vec<TensorSpec> = (shapes.iter())
        .map(|(name, shape)| TensorSpec {
            name: name.clone(),
            dtype: zimage::safetensors::Dtype::BF16,
            shape: shape.iter().map(|&s| s as u64).collect(),
        })
        .collect();
    let header = header_bytes(&specs, None, 8).unwrap();
    let mut offset = header.len() as u64;
    let mut before_proj = None;
    for (name, shape) in &shapes {
        let bytes = 2 * shape.iter().product::<usize>() as u64;
        if name == "control_noise_refiner.0.before_proj.weight" {
            before_proj = Some((offset, bytes));
        }
        offset += bytes;
    }
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&header).unwrap();
    f.set_len(offset).unwrap();
    if let (ControlNetVersion::V2_1, Some((at, len))) = (version, before_proj) {
        let random: Vec<u8> = common::controlnet::fill("before_proj", &[len as usize / 2])
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(&random).unwrap();
    }
}

#[test]
fn published_single_files_are_recognised_without_a_config() {
    let tmp = tempfile::tempdir().unwrap();
    for version in [
        ControlNetVersion::V1_0,
        ControlNetVersion::V2_0,
        ControlNetVersion::V2_1,
    ] {
        let path = tmp
            .path()
            .join(format!("union-{}.safetensors", version.name()));
        write_published(&path, version);
        let source =
            zimage::families::zimage::controlnet_source::ControlNetSource::open(&path).unwrap();
        assert_eq!(source.version(), version, "{}", path.display());
        assert_eq!(source.config, version.published_config());
        assert_eq!(source.config.version(), version);
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_file_that_is_no_controlnet_is_refused_by_name() {
    let path = models().join("z-image-tiny/transformer/diffusion_pytorch_model.safetensors");
    let err = zimage::families::zimage::controlnet_source::ControlNetSource::open(&path)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("diffusion_pytorch_model.safetensors")
            && err.contains("control_all_x_embedder.2-1.weight"),
        "{err}"
    );
}

fn stored(store: &Path, name: &str) -> zimage::loader::StoreSource {
    let store = zimage::store::Store::at(store);
    let model = store.open(name).unwrap();
    zimage::loader::StoreSource {
        store,
        model,
        read_path: zimage::loader::ReadPath::MlxLoader,
    }
}

#[test]
fn a_controlnet_stored_by_name_says_what_it_is_and_matches_diffusers() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, store) = (tmp.path().join("cn"), tmp.path().join("store"));
    common::controlnet::write_tiny_dir("2.1", &dir);
    let out = common::zimage_in(&store, &["create", "cn", "--from", common::s(&dir)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = String::from_utf8(common::zimage_in(&store, &["list"]).stdout).unwrap();
    assert!(
        list.contains("ControlNet 2.1 (2 control layers, 33 control channels)"),
        "{list}"
    );
    let show = String::from_utf8(common::zimage_in(&store, &["show", "cn"]).stdout).unwrap();
    assert!(show.contains("kind        ControlNet 2.1"), "{show}");

    let tr = transformer();
    let source = stored(&store, "cn");
    let cn = zimage::families::zimage::controlnet_source::load_stored(
        &source,
        &tr.config,
        Dtype::F32,
        zimage::models::Residency::Compute,
    )
    .unwrap();
    let diff = max_abs(
        &output_with(&tr, &cn),
        &values(&reference("2.1").t["output"]),
    );
    assert!(diff <= 1e-4, "output off by {diff}");
}

#[test]
fn a_quantized_controlnet_stays_packed_and_still_steers() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, store) = (tmp.path().join("cn"), tmp.path().join("store"));
    common::controlnet::write_tiny_dir("2.1", &dir);
    let args = [
        "create",
        "cn8",
        "--from",
        common::s(&dir),
        "--quantize",
        "int8",
    ];
    let out = common::zimage_in(&store, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let show = String::from_utf8(common::zimage_in(&store, &["show", "cn8"]).stdout).unwrap();
    assert!(show.contains("MLX affine"), "{show}");
    let tr = transformer();
    let cn = zimage::families::zimage::controlnet_source::load_stored(
        &stored(&store, "cn8"),
        &tr.config,
        Dtype::F32,
        zimage::models::Residency::Stored,
    )
    .unwrap();
    let r = reference("2.1");
    let out = output_with(&tr, &cn);
    // int8 rounding moves the output a little; the control moves it far more.
    let off = max_abs(&out, &values(&r.t["output"]));
    let moved = max_abs(&values(&r.t["output"]), &values(&r.t["plain"]));
    eprintln!("int8: max |Δ| {off:.3e}, control moves {moved:.3}");
    assert!(
        off < moved / 10.0,
        "int8 output off by {off}, control moves {moved}"
    );
}
