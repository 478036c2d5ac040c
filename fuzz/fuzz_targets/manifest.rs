//! Manifest JSON, alone and as the store opens it (size cap, schema version, every digest),
//! then what is computed from a manifest without reading blobs.
//!
//! Beyond "no panic": a manifest written back by `to_bytes` reads back equal.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zimage::loader;
use zimage::store::{blob, Manifest, Store};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = serde_json::from_slice::<Manifest>(data) {
        let back: Manifest =
            serde_json::from_slice(&m.to_bytes()).expect("a manifest we wrote reads back");
        assert_eq!(back, m, "manifest changes through to_bytes");
        let _ = m.model_identity();
        let _ = m.config_file("model_index.json");
        for digest in m.digests() {
            let _ = blob::digest_hex(digest);
        }
    }

    let root = zimage_fuzz::fresh_store();
    zimage_fuzz::put_manifest(&root, data);
    let store = Store::at(&root);
    let Ok(model) = store.open("m") else {
        return;
    };
    for digest in model.manifest.digests() {
        blob::digest_hex(digest).expect("the store checked every digest");
    }
    for component in model.manifest.components() {
        let _ = loader::tensor_sizes(&model, &component);
    }
    let _ = zimage::store::summarize(&store, &model);
    let _ = store.verify("m");
    let _ = store.list();
    let _ = store.blob_users();
});
