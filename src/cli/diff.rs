//! `zimage diff`: weight-inspect's structural diff of two model files or stored models.
//!
//! Unlike weight-inspect, `--fail-on-diff` still prints the diff before exiting with 1, and
//! errors exit with 2, so a difference and a failure can be told apart.
use super::target::{self, Target};
use std::path::PathBuf;
use std::process::ExitCode;
use zimage::formats::structural::{self, Artifact};

#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The old side: a model file (safetensors, .zt, .dfsn) or a stored model's name.
    pub a: String,
    /// The new side, the same kinds as A.
    pub b: String,
    /// Print weight-inspect's JSON result (overrides --format).
    #[arg(long)]
    pub json: bool,
    /// Text or Markdown output.
    #[arg(long, value_enum, default_value_t = DiffFormat::Text)]
    pub format: DiffFormat,
    /// Exit with 1 when the two differ (after printing the diff).
    #[arg(long)]
    pub fail_on_diff: bool,
    /// Accepted for weight-inspect compatibility; the output already shows only changes.
    #[arg(long)]
    pub only_changes: bool,
    /// List the dtype and shape changes of each modified tensor (text output).
    #[arg(long)]
    pub verbose: bool,
    /// Compare one component of the stored model(s), e.g. `transformer`.
    #[arg(long, value_name = "NAME", value_parser = super::component_arg)]
    pub component: Option<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiffFormat {
    Text,
    Md,
}

pub fn run(store: Option<PathBuf>, a: DiffArgs) -> anyhow::Result<ExitCode> {
    let target_a = target::resolve(store.as_deref(), &a.a)?;
    let target_b = target::resolve(store.as_deref(), &a.b)?;
    let is_model = |t: &Target| matches!(t, Target::Model { .. });
    if a.component.is_some() && !is_model(&target_a) && !is_model(&target_b) {
        anyhow::bail!(
            "`--component` applies to stored models, and `{}` and `{}` are files",
            a.a,
            a.b
        );
    }
    let listing = |t: &Target| {
        t.listing(if is_model(t) {
            a.component.as_deref()
        } else {
            None
        })
    };
    let mut listing_a = listing(&target_a)?;
    let mut listing_b = listing(&target_b)?;
    // The store keeps no file-level metadata, so against a stored model every key of the
    // other side would read as removed or added; such a comparison is of tensors alone.
    if let Some(name) = [(&target_a, &a.a), (&target_b, &a.b)]
        .iter()
        .find(|(t, _)| is_model(t))
        .map(|(_, n)| n)
    {
        if !listing_a.metadata.is_empty() || !listing_b.metadata.is_empty() {
            eprintln!("note: `{name}` is a stored model, which keeps no file metadata; metadata is left out of the comparison");
        }
        listing_a.metadata.clear();
        listing_b.metadata.clear();
    }

    let d = structural::diff(
        &Artifact::from_listing(&listing_a),
        &Artifact::from_listing(&listing_b),
    );
    let out = if a.json {
        structural::render_diff_json(&d)
    } else {
        match a.format {
            DiffFormat::Text => structural::render_diff_text(&d, a.verbose),
            DiffFormat::Md => structural::render_diff_markdown(&d),
        }
    };
    print!("{out}");
    Ok(if a.fail_on_diff && d.has_changes() {
        super::exit_check_failed()
    } else {
        ExitCode::SUCCESS
    })
}
