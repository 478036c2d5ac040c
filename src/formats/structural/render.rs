//! weight-inspect's renderings of `id` and `diff`, byte for byte, quirks included (the one
//! space after `Removed tensors:`, byte-length changes left out of text and Markdown, metadata
//! changes shown only in JSON). Each returns the whole output, ending in a newline.

use super::{Artifact, StructuralDiff, TensorChange};
// Writing to a `String` cannot fail, so `writeln!`'s result is dropped throughout.
use std::fmt::Write;

/// `id`: the structural id, the full hash and the counts.
pub fn render_id_text(a: &Artifact) -> String {
    let hash = a.hash();
    let mut s = String::new();
    s.push_str("Structural identity\n");
    let _ = writeln!(s, "{}", "─".repeat(18));
    let _ = writeln!(s, "ID:        {}", a.id());
    s.push_str("Stable:    yes (machine independent)\n");
    s.push_str("Includes:  header, tensor names, shapes, dtypes\n");
    s.push_str("Excludes:  raw weight bytes\n");
    let _ = writeln!(s, "\nformat: {}", format_display_name(&a.listing.format));
    let _ = writeln!(s, "structural_hash: {hash}");
    let _ = writeln!(s, "tensor_count: {}", a.tensor_count());
    let _ = writeln!(s, "metadata_count: {}", a.metadata_count());
    s
}

/// `id --json`: pretty-printed with a 2-space indent.
pub fn render_id_json(a: &Artifact) -> String {
    #[derive(serde::Serialize)]
    struct Id<'a> {
        schema: u32,
        format: &'a str,
        structural_hash: String,
        tensor_count: usize,
        metadata_count: usize,
    }
    let id = Id {
        schema: 1,
        format: &a.listing.format,
        structural_hash: a.hash(),
        tensor_count: a.tensor_count(),
        metadata_count: a.metadata_count(),
    };
    pretty(&id)
}

/// weight-inspect prints its format enum with `Debug` (`Safetensors`, `GGUF`, `Onnx`); formats
/// it does not know are capitalised the same way.
fn format_display_name(format: &str) -> String {
    match format {
        "gguf" => "GGUF".into(),
        other => {
            let mut chars = other.chars();
            match chars.next() {
                Some(first) => first.to_uppercase().chain(chars).collect(),
                None => String::new(),
            }
        }
    }
}

/// `diff` as text: the verdict, the tensor counts, whether the hash changed, and with
/// `verbose` the dtype and shape of each modified tensor.
pub fn render_diff_text(d: &StructuralDiff, verbose: bool) -> String {
    let changed = d.has_changes();
    let mut s = String::new();
    s.push_str(if changed {
        "DIFFERENT\n"
    } else {
        "IDENTICAL\n"
    });
    let _ = writeln!(s, "{}", "-".repeat(20));
    if changed {
        let _ = writeln!(s, "Added tensors:    {}", d.tensors_added.len());
        let _ = writeln!(s, "Removed tensors: {}", d.tensors_removed.len());
        let _ = writeln!(s, "Modified tensors: {}", d.tensor_changes.len());
    } else {
        s.push_str("No structural differences found.\n");
    }
    // weight-inspect never compares across formats; say why an otherwise equal pair has
    // another structural ID (the hash covers the format).
    if !d.format_equal {
        s.push_str("Format:           differs\n");
    }
    let _ = writeln!(
        s,
        "Structural ID:    {}",
        if d.hash_equal { "unchanged" } else { "changed" }
    );
    if !verbose || d.tensor_changes.is_empty() {
        return s;
    }
    let _ = writeln!(s, "\nTensor changes\n{}", "─".repeat(13));
    for c in &d.tensor_changes {
        let _ = writeln!(s, "  {}", c.name);
        push_changes(&mut s, c, "    ", "->");
    }
    s
}

/// `diff --format md`: a status line, a count table, and code blocks of added, removed and
/// modified tensors.
pub fn render_diff_markdown(d: &StructuralDiff) -> String {
    let mut s = String::new();
    let status = if d.has_changes() {
        "[DIFFERENT]"
    } else {
        "[IDENTICAL]"
    };
    let _ = writeln!(s, "## Structural Diff\n\n**Status:** {status}\n");
    s.push_str("| Change Type | Count |\n|-------------|-------|\n");
    let _ = writeln!(s, "| Added tensors | {} |", d.tensors_added.len());
    let _ = writeln!(s, "| Removed tensors | {} |", d.tensors_removed.len());
    let _ = writeln!(s, "| Modified tensors | {} |\n", d.tensor_changes.len());
    if !d.tensors_added.is_empty() {
        s.push_str("### Added tensors\n```\n");
        for name in &d.tensors_added {
            let _ = writeln!(s, "+ {name}");
        }
        s.push_str("```\n");
    }
    if !d.tensors_removed.is_empty() {
        s.push_str("### Removed tensors\n```\n");
        for name in &d.tensors_removed {
            let _ = writeln!(s, "- {name}");
        }
        s.push_str("```\n");
    }
    if !d.tensor_changes.is_empty() {
        s.push_str("### Modified tensors\n```\n");
        for c in &d.tensor_changes {
            let _ = writeln!(s, "~ {}", c.name);
            push_changes(&mut s, c, "  ", "→");
        }
        s.push_str("```\n");
    }
    s
}

/// `diff --json`: the whole result, pretty-printed with a 2-space indent.
pub fn render_diff_json(d: &StructuralDiff) -> String {
    pretty(d)
}

/// The dtype and shape lines of one tensor change; weight-inspect never prints byte lengths.
fn push_changes(s: &mut String, c: &TensorChange, indent: &str, arrow: &str) {
    if let (Some(old), Some(new)) = (&c.dtype_old, &c.dtype_new) {
        let _ = writeln!(s, "{indent}dtype: {old} {arrow} {new}");
    }
    if let (Some(old), Some(new)) = (&c.shape_old, &c.shape_new) {
        let _ = writeln!(s, "{indent}shape: {old:?} {arrow} {new:?}");
    }
}

fn pretty<T: serde::Serialize>(value: &T) -> String {
    let mut s = serde_json::to_string_pretty(value).expect("plain structs always serialise");
    s.push('\n');
    s
}
