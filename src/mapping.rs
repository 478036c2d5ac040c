//! A checkpoint's tensors mapped onto the diffusers names the store and the pipelines use:
//! the pieces every layout shares (the component a tensor belongs to, renames, row ranges of a
//! fused tensor, the config inferred from shapes, the tensors an export joins), whichever
//! family's names they are. `crate::layouts` maps whole components with them.

use crate::store::SourceTensor;
use std::collections::BTreeMap;

/// The safetensors metadata key under which an exported file carries its component's
/// diffusers config (JSON text).
pub const CONFIG_METADATA_KEY: &str = "zimage.config";

/// The pipeline components a single checkpoint file can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Component {
    Transformer,
    TextEncoder,
    /// A pipeline's second text encoder (T5's encoder beside CLIP's text model), which only
    /// some families have.
    TextEncoder2,
    Vae,
}

impl Component {
    pub const ALL: [Component; 4] = [
        Component::Transformer,
        Component::TextEncoder,
        Component::TextEncoder2,
        Component::Vae,
    ];

    /// The component's folder in a diffusers directory and in the store.
    pub fn dir(self) -> &'static str {
        match self {
            Component::Transformer => "transformer",
            Component::TextEncoder => "text_encoder",
            Component::TextEncoder2 => "text_encoder_2",
            Component::Vae => "vae",
        }
    }

    /// The `create` option that gives the component as a file.
    pub fn flag(self) -> &'static str {
        match self {
            Component::Transformer => "--transformer",
            Component::TextEncoder => "--text-encoder",
            Component::TextEncoder2 => "--text-encoder-2",
            Component::Vae => "--vae",
        }
    }

    /// Whether only some pipelines have the component (a model without it is whole).
    pub fn optional(self) -> bool {
        self == Component::TextEncoder2
    }
}

/// How a component's tensors were named in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Layout {
    /// diffusers' (or transformers') own names: stored as they are.
    Diffusers,
    /// The original layout: a family's own transformer names, a Qwen3 without its `model.`
    /// prefix, or the LDM/Flux VAE names.
    Original,
}

/// A component's tensors under diffusers names, with the config that goes with them.
#[derive(Debug, Clone)]
pub struct Mapped {
    pub component: Component,
    pub layout: Layout,
    /// Under their diffusers names, `component` set to [`Component::dir`].
    pub tensors: Vec<SourceTensor>,
    /// `config.json` of the component as the shapes tell it, Turbo's values for the rest.
    pub config: serde_json::Value,
    /// The config keys read off the shapes, each with the tensor that tells it.
    pub shape_keys: Vec<(&'static str, String)>,
    /// The config the file's metadata carries (see [`CONFIG_METADATA_KEY`]).
    pub hint: Option<serde_json::Value>,
    /// Tensors of the file that the pipeline has no use for and that were left out (a
    /// language-model head, an unused final norm).
    pub dropped: Vec<String>,
    /// Config keys no shape tells and no default fits, which `config` leaves out: a config the
    /// model gives (its file's metadata, `--from`'s) must say them.
    pub untold: Vec<Untold>,
}

/// A config key the shapes do not tell and that has no default for this checkpoint (the RoPE
/// axes of an unusual head size, the head count of an unusual width).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untold {
    pub key: &'static str,
    /// The tensor whose shape makes the default unfit.
    pub tensor: String,
    /// Why, for the refusal when nothing gives the key.
    pub reason: String,
}

impl Mapped {
    /// `component`'s tensors, in diffusers names now, with the config their shapes tell;
    /// `dropped` names what the file held that the pipeline has no use for.
    pub(crate) fn new(
        component: Component,
        layout: Layout,
        tensors: Vec<SourceTensor>,
        inferred: Inferred,
        dropped: Vec<String>,
    ) -> Mapped {
        Mapped {
            component,
            layout,
            tensors,
            config: inferred.config,
            shape_keys: inferred.shape_keys,
            hint: None,
            dropped,
            untold: Vec::new(),
        }
    }

    /// The same, with `untold` the keys a given config must say.
    pub(crate) fn with_untold(mut self, untold: Vec<Untold>) -> Mapped {
        self.untold = untold;
        self
    }
}

/// Which layout a component's names are in: diffusers' when some name starts with one of
/// `diffusers`, the original when some starts with one of `original`; else the error naming
/// what was `expected` of the `component`.
pub(crate) fn layout_of(
    tensors: &[SourceTensor],
    (diffusers, original): (&[&str], &[&str]),
    what: &str,
    (component, expected): (&'static str, &'static str),
) -> Result<Layout, LayoutError> {
    let has = |prefixes: &[&str]| {
        (tensors.iter()).any(|t| prefixes.iter().any(|p| t.name.starts_with(p)))
    };
    if has(diffusers) {
        Ok(Layout::Diffusers)
    } else if has(original) {
        Ok(Layout::Original)
    } else {
        Err(LayoutError::Unknown {
            what: what.to_string(),
            component,
            expected,
            found: sample(tensors),
        })
    }
}

/// Which rows of an original layer a diffusers layer holds: the original's rows cut into `of`
/// equal parts, and these parts in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    pub of: u64,
    pub parts: &'static [u64],
}

impl Rows {
    /// All rows, in order.
    pub const WHOLE: Rows = Rows { of: 1, parts: &[0] };

    /// The row ranges `[start, end)` this takes of an original layer of `rows` rows, in order;
    /// `None` when `rows` does not cut into `of` equal parts.
    pub fn ranges(self, rows: u64) -> Option<Vec<(u64, u64)>> {
        let part = rows.is_multiple_of(self.of).then(|| rows / self.of)?;
        Some(
            self.parts
                .iter()
                .map(|&p| (p * part, (p + 1) * part))
                .collect(),
        )
    }
}

/// A config inferred from shapes: the JSON, and the keys the shapes tell with their tensors.
pub struct Inferred {
    pub config: serde_json::Value,
    pub shape_keys: Vec<(&'static str, String)>,
}

/// One tensor of an exported file: the stored (diffusers-named) tensors whose bytes, one after
/// the other, make it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    pub name: String,
    pub shape: Vec<u64>,
    /// Diffusers names, concatenated along the first axis.
    pub parts: Vec<String>,
    /// Rows the concatenation is rotated by: it is written from this row on, then its first
    /// rows (0: as it is).
    pub roll_rows: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("{what}: the tensors are in no layout known for the {component}; expected {expected} (found e.g. {found})")]
    Unknown {
        what: String,
        component: &'static str,
        expected: &'static str,
        found: String,
    },
    #[error("{what}: tensor `{tensor}` {reason}")]
    Tensor {
        what: String,
        tensor: String,
        reason: String,
    },
    #[error("{what}: no tensor `{tensor}`, which the {component} needs")]
    Missing {
        what: String,
        component: &'static str,
        tensor: String,
    },
    #[error("{what} is {found}, which is given as {flag}")]
    WrongSlot {
        what: String,
        found: &'static str,
        flag: &'static str,
    },
    #[error("{what}: tensor `{tensor}` appears twice once renamed (also as `{other}`)")]
    Duplicate {
        what: String,
        tensor: String,
        other: String,
    },
}

/// `bytes` of `rows` equal rows rotated so that row `by` comes first (a [`Joined`]'s roll).
pub(crate) fn roll_rows(bytes: &mut [u8], rows: u64, by: u64) {
    let at = bytes.len() as u64 / rows.max(1) * by;
    let at = (at as usize).min(bytes.len());
    bytes.rotate_left(at);
}

pub(crate) fn check_unique(tensors: &[SourceTensor], what: &str) -> Result<(), LayoutError> {
    let mut seen = BTreeMap::new();
    for t in tensors {
        if let Some(prev) = seen.insert(t.name.as_str(), t) {
            return Err(LayoutError::Duplicate {
                what: what.to_string(),
                tensor: t.name.clone(),
                other: prev.name.clone(),
            });
        }
    }
    Ok(())
}

/// The rows `start..end` of a tensor whose first axis is rows, as a byte range of the same
/// file: rows are contiguous in every layout a [`SourceTensor`] describes.
pub fn rows(t: &SourceTensor, start: u64, end: u64, name: &str) -> Result<SourceTensor, String> {
    let bad = || {
        format!(
            "cannot be cut into rows {start}..{end} (shape {:?}, {} bytes)",
            t.shape, t.nbytes
        )
    };
    let total = *t.shape.first().ok_or("has no rows")?;
    if total == 0 || !t.nbytes.is_multiple_of(total) {
        return Err(bad());
    }
    let mut out = t.rows(start, end).ok_or_else(bad)?;
    out.name = name.to_string();
    Ok(out)
}

/// The same bytes under another name (and optionally another shape of the same size).
pub(crate) fn renamed(t: &SourceTensor, name: String, shape: Option<Vec<u64>>) -> SourceTensor {
    SourceTensor {
        name,
        shape: shape.unwrap_or_else(|| t.shape.clone()),
        ..t.clone()
    }
}

/// Removes from the names that have it the longest of `prefixes` that some name has (a
/// checkpoint's `model.diffusion_model.`, say).
pub(crate) fn strip_prefix(tensors: &mut [SourceTensor], prefixes: &[&str]) {
    let Some(prefix) = prefixes
        .iter()
        .filter(|p| tensors.iter().any(|t| t.name.starts_with(**p)))
        .max_by_key(|p| p.len())
    else {
        return;
    };
    for t in tensors {
        if let Some(rest) = t.name.strip_prefix(*prefix) {
            t.name = rest.to_string();
        }
    }
}

/// A few names of the file, for an error that says what was found instead.
pub(crate) fn sample(tensors: &[SourceTensor]) -> String {
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort();
    let shown: Vec<String> = names.iter().take(4).map(|n| format!("`{n}`")).collect();
    if shown.is_empty() {
        "no tensors".into()
    } else {
        shown.join(", ")
    }
}

/// The tensors of a component looked up by name, with errors that name the source.
pub(crate) struct ByName<'a> {
    pub what: &'a str,
    pub component: &'static str,
    pub map: BTreeMap<&'a str, &'a SourceTensor>,
}

impl<'a> ByName<'a> {
    pub fn new(what: &'a str, component: &'static str, tensors: &'a [SourceTensor]) -> Self {
        ByName {
            what,
            component,
            map: tensors.iter().map(|t| (t.name.as_str(), t)).collect(),
        }
    }

    pub fn get(&self, name: &str) -> Result<&'a SourceTensor, LayoutError> {
        self.map
            .get(name)
            .copied()
            .ok_or_else(|| LayoutError::Missing {
                what: self.what.to_string(),
                component: self.component,
                tensor: name.to_string(),
            })
    }

    /// Axis `axis` of tensor `name`, which must have `rank` axes.
    pub fn dim(&self, name: &str, rank: usize, axis: usize) -> Result<u64, LayoutError> {
        let t = self.get(name)?;
        if t.shape.len() != rank {
            return Err(LayoutError::Tensor {
                what: self.what.to_string(),
                tensor: name.to_string(),
                reason: format!("has shape {:?}, expected {rank} axes", t.shape),
            });
        }
        Ok(t.shape[axis])
    }

    /// How many `prefix{i}.` blocks there are, counting from 0 without gaps.
    pub fn count(&self, prefix: &str) -> u64 {
        (0..)
            .take_while(|i| {
                let p = format!("{prefix}{i}.");
                self.map.keys().any(|k| k.starts_with(&p))
            })
            .count() as u64
    }

    pub fn bad(&self, tensor: &str, reason: String) -> LayoutError {
        LayoutError::Tensor {
            what: self.what.to_string(),
            tensor: tensor.to_string(),
            reason,
        }
    }
}
