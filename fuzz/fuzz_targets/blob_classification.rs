//! How the store tells Ollama's blob generations apart from a blob's bytes, without reading
//! tensor data: `verify` (layer against header), `summarize` (main tensor and companions) and
//! `load_component`'s layout decisions (v1 `data`, v1 quantized `_scale`/`_qbias` layers, v2
//! named, v2 quantized `.scale`/`.bias` with `__metadata__`), whose arrays stay lazy. Reading
//! the data through MLX is `blob_load`'s job. The input is described at
//! [`zimage_fuzz::blob_store`].

#![no_main]

use libfuzzer_sys::fuzz_target;
use zimage::loader;

fuzz_target!(|data: &[u8]| {
    let Some((store, model, read_path)) = zimage_fuzz::blob_store(data) else {
        return;
    };
    let _ = store.verify("m");
    let _ = zimage::store::summarize(&store, &model);
    let _ = loader::tensor_sizes(&model, "c");
    let _ = loader::load_component(&store, &model, "c", read_path);
});
