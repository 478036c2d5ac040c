//! Loads one component of a stored model as MLX arrays, as a program that brings its own model
//! code would: open the store, resolve a name, read the component's blobs, evaluate them, and
//! print each tensor's name, shape and dtype with the time the load took (`zimage profile`
//! measures the same load for every component).
//!
//! `cargo run --example load_weights -- [MODEL [COMPONENT]]`: with no model, the demo model is
//! imported into a temporary store first; the component defaults to `transformer`.

use std::time::Instant;
use zimage::loader::{self, ReadPath};
use zimage::store::{ImportOptions, Store};

fn main() -> anyhow::Result<()> {
    zimage::start()?;
    let mut args = std::env::args().skip(1);
    let scratch = tempfile::tempdir()?;
    let (store, name) = match args.next() {
        Some(name) => (Store::locate(None)?, name),
        None => {
            let store = Store::at(scratch.path());
            let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny");
            let source = zimage::diffusers_dir::DiffusersDir::open(&demo)?;
            store.create("demo", &source, &ImportOptions::default(), &|_| {})?;
            (store, "demo".to_string())
        }
    };
    let component = args.next().unwrap_or_else(|| "transformer".into());

    let model = store.open(&name)?;
    let start = Instant::now();
    let loaded = loader::load_component(&store, &model, &component, ReadPath::Mmap)?;
    loaded.eval()?;
    let seconds = start.elapsed().as_secs_f64();

    for (tensor, array) in &loaded.tensors {
        println!("{tensor:60} {:?} {:?}", array.shape(), array.dtype());
    }
    for (tensor, q) in &loaded.quantized {
        println!(
            "{tensor:60} {:?} {}-bit, groups of {} ({:?})",
            q.shape(),
            q.bits,
            q.group_size,
            q.mode
        );
    }
    println!(
        "{name} {component}: {} tensors, {} blobs, {:.1} MB in {:.3} s",
        loaded.tensors.len() + loaded.quantized.len(),
        loaded.blobs,
        loaded.bytes as f64 / 1e6,
        seconds
    );
    Ok(())
}
