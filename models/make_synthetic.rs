//! Writes a synthetic Z-Image-Turbo: a diffusers directory with the real widths, random weights
//! and the depth you choose (default: the real one, about 20 GB in bf16).
//!
//! ```sh
//! cargo run --release --example make_synthetic -- --out /tmp/z-image-synthetic
//! cargo run --release --example make_synthetic -- --out /tmp/z2 --layers 2 --refiner-layers 1 --text-layers 2
//! cargo run --release --example make_synthetic -- --out /tmp/unused --dry-run   # sizes only
//! cargo run --release --example make_synthetic -- --controlnet /tmp/cn-2.1.safetensors # ControlNet 2.1 only
//! ```

#[path = "synthetic.rs"]
mod synthetic;

use clap::Parser;
use std::path::PathBuf;
use synthetic::{Spec, WeightDtype};

#[derive(Parser)]
#[command(about = "Write a Z-Image-Turbo with the real widths and random weights")]
struct Args {
    /// Output directory (created; must be empty if it exists). Without it, only `--controlnet`
    /// is written.
    #[arg(long, required_unless_present = "controlnet")]
    out: Option<PathBuf>,
    /// Transformer main blocks (`n_layers`; real: 30).
    #[arg(long, default_value_t = 30)]
    layers: u32,
    /// Transformer noise and context refiners, each (`n_refiner_layers`; real: 2).
    #[arg(long, default_value_t = 2)]
    refiner_layers: u32,
    /// Text encoder layers (`num_hidden_layers`; real: 36).
    #[arg(long, default_value_t = 36)]
    text_layers: u32,
    /// Storage dtype: bf16 or f32.
    #[arg(long, default_value = "bf16")]
    dtype: WeightDtype,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also write a ControlNet Union 2.1 at the real widths, as its authors publish it (one
    /// safetensors file, 6.7 GB in bf16), to this file.
    #[arg(long, value_name = "FILE")]
    controlnet: Option<PathBuf>,
    /// Print what would be written, write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Skip the fsync before each rename (files still land atomically, but may not be on disk
    /// yet when this returns).
    #[arg(long)]
    no_sync: bool,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let spec = Spec {
        layers: a.layers,
        refiner_layers: a.refiner_layers,
        text_layers: a.text_layers,
        dtype: a.dtype,
        seed: a.seed,
    };
    if a.dry_run {
        println!("{}", synthetic::plan(&spec));
        return Ok(());
    }
    if let Some(path) = &a.controlnet {
        let bytes =
            synthetic::write_controlnet(path, zimage::models::ControlNetVersion::V2_1, &spec)?;
        println!("wrote {} ({bytes} bytes, ControlNet 2.1)", path.display());
    }
    let Some(out) = &a.out else {
        return Ok(());
    };
    let opts = synthetic::Options { sync: !a.no_sync };
    let (summary, t) = synthetic::write_with(out, &spec, &opts)?;
    println!("{summary}");
    let gb = summary.file_bytes() as f64 / 1e9;
    println!(
        "wrote {} in {:.1} s: data generated and written at {:.2} GB/s ({:.1} s), fsync {:.1} s, \
         {:.2} GB/s overall",
        out.display(),
        t.total_s,
        gb / t.generate_s,
        t.generate_s,
        t.sync_s,
        gb / t.total_s
    );
    Ok(())
}
