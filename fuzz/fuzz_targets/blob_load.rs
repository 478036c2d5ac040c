//! A classified blob read through MLX: the arrays `load_component` returns evaluated (MLX's
//! loader or a memory map), and quantized ones dequantized. The input is described at
//! [`zimage_fuzz::blob_store`]; `blob_classification` covers the same inputs without MLX
//! reading the data.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zimage::loader;

fuzz_target!(|data: &[u8]| {
    let Some((store, model, read_path)) = zimage_fuzz::blob_store(data) else {
        return;
    };
    let Ok(loaded) = loader::load_component(&store, &model, "c", read_path) else {
        return;
    };
    if loaded.eval().is_err() {
        return;
    }
    if let Ok(arrays) = loaded.into_arrays() {
        let all: Vec<_> = arrays.values().collect();
        let _ = zimage::mlx::eval(&all);
    }
});
