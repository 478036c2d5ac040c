//! A generation loads its weights the way `zimage profile` measures them: each component read
//! and materialised in one batched evaluation of the same arrays, and no evaluation per tensor.

mod common;

use common::zimage_in;
use std::path::Path;
use zimage::loader::{self, ReadPath, StoreSource};
use zimage::mlx::{self, EvalCount};
use zimage::pipeline::ModelSource;
use zimage::store::Store;

const COMPONENTS: [&str; 3] = ["text_encoder", "transformer", "vae"];

fn import(root: &Path, name: &str, extra: &[&str]) {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
    let mut args = vec!["create", name, "--from", demo.to_str().unwrap()];
    args.extend(extra);
    let out = zimage_in(root, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn since(before: EvalCount) -> EvalCount {
    let now = mlx::eval_count();
    EvalCount {
        calls: now.calls - before.calls,
        arrays: now.arrays - before.arrays,
    }
}

/// The evaluations a pipeline's loads run, component by component.
fn pipeline_loads(store: &Store, name: &str) -> Vec<(EvalCount, usize)> {
    let source = StoreSource {
        store: store.clone(),
        model: store.open(name).unwrap(),
        read_path: ReadPath::MlxLoader,
    };
    COMPONENTS
        .iter()
        .map(|c| {
            let before = mlx::eval_count();
            let weights = source.component(c).unwrap();
            let arrays = weights.tensors.len()
                + weights
                    .quantized
                    .values()
                    .map(|q| q.arrays().len())
                    .sum::<usize>();
            (since(before), arrays)
        })
        .collect()
}

#[test]
fn generate_and_profile_materialise_the_same_arrays_in_the_same_evaluations() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    import(&root, "me/tiny:bf16", &["--dtype", "bf16"]);
    import(&root, "me/tiny:int4", &["--quantize", "int4"]);
    let store = Store::at(&root);
    for name in ["me/tiny:bf16", "me/tiny:int4"] {
        let loads = pipeline_loads(&store, name);
        for ((count, arrays), component) in loads.iter().zip(COMPONENTS) {
            // One evaluation of every array the component holds, none per tensor.
            assert_eq!(
                *count,
                EvalCount {
                    calls: 1,
                    arrays: *arrays as u64
                },
                "{name} {component}"
            );
        }

        // `profile` runs one warm-up evaluation of the first blob's arrays, then the same
        // evaluations as the pipeline, component by component.
        let model = store.open(name).unwrap();
        let first = model.manifest.tensor_layers().next().unwrap();
        let warm = mlx::io::load_safetensors(&store.blob_path(&first.digest).unwrap())
            .unwrap()
            .tensors
            .len() as u64;
        let before = mlx::eval_count();
        let (_, profiles) = loader::profile(&store, &model, ReadPath::MlxLoader).unwrap();
        let components: Vec<&str> = profiles.iter().map(|p| p.component.as_str()).collect();
        assert_eq!(components, model.manifest.components());
        let pipeline: u64 = loads.iter().map(|(c, _)| c.arrays).sum();
        assert_eq!(
            since(before),
            EvalCount {
                calls: 1 + loads.len() as u64,
                arrays: warm + pipeline
            },
            "{name}"
        );
    }
}
