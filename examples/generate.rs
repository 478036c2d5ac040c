//! An image from a prompt through zimage's library: a stored model by name, or with no
//! arguments the demo model (a tiny Z-Image with random weights, so expect noise).
//!
//! `cargo run --example generate -- [MODEL [PROMPT]]` writes `generated.png`.

use zimage::generation::{self, Cancel, Engine, Job, ModelChoice};

fn main() -> anyhow::Result<()> {
    zimage::start()?;
    let mut args = std::env::args().skip(1);
    let model = match args.next() {
        Some(name) => ModelChoice::Stored {
            store: zimage::store::Store::locate(None)?,
            name,
        },
        None => ModelChoice::Directory(
            env!("CARGO_MANIFEST_DIR")
                .parse::<std::path::PathBuf>()?
                .join("models/z-image-tiny"),
        ),
    };
    let prompt = args
        .next()
        .unwrap_or_else(|| "a red fox in the snow".into());
    let mut job = Job::new(model, prompt);
    job.seed = 42;
    let mut engine = Engine::new(None, false);
    let mut report =
        |p: &generation::Progress| eprintln!("{} step {}/{}", p.phase, p.step, p.steps);
    let outcome = generation::run(&job, &mut engine, &mut report, &Cancel::new())?;
    let image = &outcome.images[0];
    std::fs::write("generated.png", &image.png)?;
    println!(
        "generated.png: {}×{}, seed {}, {} steps",
        image.width, image.height, image.seed, image.steps
    );
    Ok(())
}
