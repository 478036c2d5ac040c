//! Writes a synthetic Z-Image-Turbo, with `--klein` a FLUX.2 \[klein\] 4B or 9B, with
//! `--flux3` a FLUX.3 \[klein\] (step-distilled or base), or with `--flux1` a FLUX.1 \[dev\],
//! \[schnell\] or Kontext \[dev\]: a diffusers directory with the real widths, random weights
//! and the depth you choose (default: the real one, about 20 GB in bf16; klein 4B 16 GB, 9B
//! 35 GB; FLUX.3 19 GB; FLUX.1 34 GB).
//!
//! ```sh
//! cargo run --release --example make_synthetic -- --out /tmp/z-image-synthetic
//! cargo run --release --example make_synthetic -- --out /tmp/z2 --layers 2 --refiner-layers 1 --text-layers 2
//! cargo run --release --example make_synthetic -- --out /tmp/unused --dry-run   # sizes only
//! cargo run --release --example make_synthetic -- --controlnet /tmp/cn-2.1.safetensors # ControlNet 2.1 only
//! cargo run --release --example make_synthetic -- --out /tmp/klein-4b --klein 4b
//! cargo run --release --example make_synthetic -- --out /tmp/k2 --klein 4b --layers 1 --single-layers 1
//! cargo run --release --example make_synthetic -- --out /tmp/unused --flux3 distilled --dry-run
//! cargo run --release --example make_synthetic -- --out /tmp/f3 --flux3 base --layers 0 --single-layers 1 --text-layers 32
//! cargo run --release --example make_synthetic -- --out /tmp/unused --flux1 schnell --dry-run
//! cargo run --release --example make_synthetic -- --out /tmp/f1 --flux1 dev --layers 1 --single-layers 1 --text-layers 1 --t5-layers 1
//! ```

#[path = "synthetic.rs"]
mod synthetic;

use clap::Parser;
use std::path::PathBuf;
use synthetic::{flux1, flux3, klein, Spec, WeightDtype};

#[derive(Parser)]
#[command(about = "Write a Z-Image-Turbo with the real widths and random weights")]
struct Args {
    /// Output directory (created; must be empty if it exists). Without it, only `--controlnet`
    /// is written.
    #[arg(long, required_unless_present = "controlnet")]
    out: Option<PathBuf>,
    /// Write a FLUX.2 [klein] of this size (4b or 9b) instead of a Z-Image-Turbo.
    #[arg(long, value_parser = ["4b", "9b"])]
    klein: Option<String>,
    /// Write a FLUX.3 [klein] instead of a Z-Image-Turbo: the step-distilled flow map or the
    /// base model.
    #[arg(long, value_parser = ["distilled", "base"], conflicts_with = "klein")]
    flux3: Option<String>,
    /// Write a FLUX.1 instead of a Z-Image-Turbo: dev (guidance-distilled), schnell
    /// (step-distilled) or kontext (Kontext dev, which edits a picture).
    #[arg(long, value_parser = ["dev", "schnell", "kontext"], conflicts_with_all = ["klein", "flux3"])]
    flux1: Option<String>,
    /// Transformer main blocks (`n_layers`; real: 30); with `--klein`, double-stream blocks
    /// (real: 5 for 4B, 8 for 9B); with `--flux3`, the blocks of each of the three modes
    /// (real: 5); with `--flux1`, double-stream blocks (real: 19).
    #[arg(long)]
    layers: Option<u32>,
    /// With `--klein`: single-stream blocks (real: 20 for 4B, 24 for 9B); with `--flux3`, joint
    /// blocks (real: 28); with `--flux1`, single-stream blocks (real: 38).
    #[arg(long)]
    single_layers: Option<u32>,
    /// Transformer noise and context refiners, each (`n_refiner_layers`; real: 2).
    #[arg(long, default_value_t = 2)]
    refiner_layers: u32,
    /// Text encoder layers (`num_hidden_layers`; real: 36; klein reads layer 27's output, so it
    /// needs at least 27; FLUX.3 reads layer 32's, so it needs at least 32); with `--flux1`,
    /// CLIP's layers (real: 12).
    #[arg(long)]
    text_layers: Option<u32>,
    /// With `--flux1`: T5's blocks (real: 24).
    #[arg(long, requires = "flux1")]
    t5_layers: Option<u32>,
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
    if let Some(size) = &a.klein {
        return write_klein(&a, size);
    }
    if let Some(variant) = &a.flux3 {
        return write_flux3(&a, variant);
    }
    if let Some(variant) = &a.flux1 {
        return write_flux1(&a, variant);
    }
    let spec = Spec {
        layers: a.layers.unwrap_or(30),
        refiner_layers: a.refiner_layers,
        text_layers: a.text_layers.unwrap_or(36),
        dtype: a.dtype,
        seed: a.seed,
    };
    if a.dry_run {
        println!("{}", synthetic::plan(&spec));
        return Ok(());
    }
    if let Some(path) = &a.controlnet {
        let bytes = synthetic::write_controlnet(
            path,
            zimage::families::zimage::ControlNetVersion::V2_1,
            &spec,
        )?;
        println!("wrote {} ({bytes} bytes, ControlNet 2.1)", path.display());
    }
    let Some(out) = &a.out else {
        return Ok(());
    };
    let opts = synthetic::Options { sync: !a.no_sync };
    let written = synthetic::write_with(out, &spec, &opts)?;
    report(out, written);
    Ok(())
}

/// Writes the klein model `--klein` names, at the depth the flags give.
fn write_klein(a: &Args, size: &str) -> anyhow::Result<()> {
    let real = match size {
        "9b" => klein::KLEIN_9B,
        _ => klein::KLEIN_4B,
    };
    let spec = klein::KleinSpec {
        size: klein::Size {
            double_layers: a.layers.unwrap_or(real.double_layers),
            single_layers: a.single_layers.unwrap_or(real.single_layers),
            text_layers: a.text_layers.unwrap_or(real.text_layers),
            ..real
        },
        dtype: a.dtype,
        seed: a.seed,
    };
    if a.dry_run {
        println!("{}", klein::plan(&spec));
        return Ok(());
    }
    let out = a
        .out
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("--klein needs --out DIR"))?;
    let opts = synthetic::Options { sync: !a.no_sync };
    report(out, klein::write_with(out, &spec, &opts)?);
    Ok(())
}

/// Writes the FLUX.3 model `--flux3` names, at the depth the flags give.
fn write_flux3(a: &Args, variant: &str) -> anyhow::Result<()> {
    let real = flux3::FLUX3_KLEIN;
    let spec = flux3::Flux3Spec {
        size: flux3::Size {
            mode_layers: a.layers.unwrap_or(real.mode_layers),
            single_layers: a.single_layers.unwrap_or(real.single_layers),
            text_layers: a.text_layers.unwrap_or(real.text_layers),
            ..real
        },
        flow_map: variant == "distilled",
        dtype: a.dtype,
        seed: a.seed,
    };
    if a.dry_run {
        println!("{}", flux3::plan(&spec));
        return Ok(());
    }
    let out = a
        .out
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("--flux3 needs --out DIR"))?;
    let opts = synthetic::Options { sync: !a.no_sync };
    report(out, flux3::write_with(out, &spec, &opts)?);
    Ok(())
}

/// Writes the FLUX.1 model `--flux1` names, at the depths the flags give.
fn write_flux1(a: &Args, variant: &str) -> anyhow::Result<()> {
    let real = flux1::FLUX1;
    let spec = flux1::Flux1Spec {
        variant: variant.parse().map_err(anyhow::Error::msg)?,
        size: flux1::Size {
            double_layers: a.layers.unwrap_or(real.double_layers),
            single_layers: a.single_layers.unwrap_or(real.single_layers),
            clip_layers: a.text_layers.unwrap_or(real.clip_layers),
            t5_layers: a.t5_layers.unwrap_or(real.t5_layers),
        },
        dtype: a.dtype,
        seed: a.seed,
    };
    if a.dry_run {
        println!("{}", flux1::plan(&spec));
        return Ok(());
    }
    let out = a
        .out
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("--flux1 needs --out DIR"))?;
    let opts = synthetic::Options { sync: !a.no_sync };
    report(out, flux1::write_with(out, &spec, &opts)?);
    Ok(())
}

/// What was written and how fast.
fn report(out: &std::path::Path, (summary, t): (synthetic::Summary, synthetic::Timing)) {
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
}
