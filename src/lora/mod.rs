//! LoRA adapters: low-rank updates `W + s·alpha/r·B·A` to a model's linear layers, read from
//! the files trainers write and applied unfused (`y = base(x) + s·(x·Aᵀ)·Bᵀ`), so the base
//! weights are never copied and a quantized base stays packed.
//!
//! - [`layout`]: the key layouts (diffusers/PEFT, ComfyUI, kohya) and what each key names;
//! - [`adapter`]: a file's pairs, read and checked, and a pair bound to a layer;
//! - [`stored`]: LoRAs kept in a stored model as layers of their own, beside the base's.
//!
//! [`Adapters::load`] resolves every file against the model's linear layers before any weight
//! loads: a key that names no layer is an error naming the closest one, unless lenient. Which
//! names a layer answers to depends on the model's family: its diffusers name always, and the
//! original names its family's checkpoints use where it has them ([`OriginalNames`]), a fused
//! `qkv` standing for the three layers its rows hold.

pub mod adapter;
pub mod layout;
pub mod stored;

pub use crate::models::weights::LoraPair;
pub use adapter::{LoraFile, StoredPair};
pub use layout::{Component, Layout, ModuleKey};

use crate::mapping::Rows;
use crate::memory_plan::TensorSize;
use crate::mlx::{self, ops, Array, Dtype};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("LoRA `{}`: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    #[error("LoRA {0}")]
    Read(crate::files::FileError),
    #[error("LoRA {0}")]
    Format(crate::safetensors::Error),
    #[error("--lora `{0}`: {1}")]
    Spec(String, String),
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("model `{model}`: {reason}")]
    Model { model: String, reason: String },
    #[error("model `{model}`: LoRA layer `{layer}`: {reason}; the model is damaged: create it again with `zimage create … --lora`")]
    Stored {
        model: String,
        layer: String,
        reason: String,
    },
}

// Written out rather than `#[from]`, which would chain the cause the message already shows.
impl From<crate::files::FileError> for Error {
    fn from(e: crate::files::FileError) -> Self {
        Error::Read(e)
    }
}

impl From<crate::safetensors::Error> for Error {
    fn from(e: crate::safetensors::Error) -> Self {
        Error::Format(e)
    }
}

/// The longest name an error shows: a hostile key is cut, not echoed whole.
const SHOWN_CHARS: usize = 120;

/// `name` escaped (control characters as escapes) and cut for a one-line message.
pub(crate) fn shown(name: &str) -> String {
    let escaped: String = name.chars().flat_map(char::escape_debug).collect();
    match escaped.char_indices().nth(SHOWN_CHARS) {
        Some((at, _)) => format!("{}…", &escaped[..at]),
        None => escaped,
    }
}

/// One `--lora FILE[:SCALE]`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LoraSpec {
    pub path: PathBuf,
    pub scale: f32,
}

/// The largest scale magnitude accepted: LoRAs are used at −2…2; past this an image is noise.
pub const MAX_SCALE: f32 = 100.0;

/// What is wrong with a LoRA's scale, if anything.
pub fn scale_error(scale: f32) -> Option<String> {
    let max = f64::from(MAX_SCALE);
    (!crate::number::within(scale, -max..=max))
        .then(|| format!("scale {scale} must be a finite number within -{MAX_SCALE}..={MAX_SCALE}"))
}

impl LoraSpec {
    /// `FILE` or `FILE:SCALE`; a suffix after the last `:` that is not a number is part of the
    /// file name.
    pub fn parse(arg: &str) -> Result<LoraSpec, Error> {
        let spec = |reason: String| Error::Spec(shown(arg), reason);
        let (path, scale) = match arg.rsplit_once(':') {
            Some((path, scale)) if scale.trim().parse::<f32>().is_ok() => {
                (path, scale.trim().parse::<f32>().unwrap_or(1.0))
            }
            _ => (arg, 1.0),
        };
        if path.is_empty() {
            return Err(spec("no file before the scale; give FILE[:SCALE]".into()));
        }
        if let Some(e) = scale_error(scale) {
            return Err(spec(e));
        }
        Ok(LoraSpec {
            path: PathBuf::from(path),
            scale,
        })
    }
}

/// The linear layers of one model component, `[out, in]` by dotted name, with the other names
/// the family's checkpoints give them and kohya's spelling of each.
#[derive(Debug, Default)]
pub struct Modules {
    shapes: BTreeMap<String, [u64; 2]>,
    /// Original names (FLUX.2's BFL names), each with the layers it stands for and which of
    /// its rows each holds.
    originals: BTreeMap<String, Vec<(String, Rows)>>,
    flat: HashMap<String, String>,
}

/// The original names a family's checkpoints give a diffusers-named linear layer of its
/// transformer: the original layer and which of its rows the diffusers layer holds.
pub type OriginalNames = fn(&str) -> Option<(String, Rows)>;

/// A layer a key targets, with the rows of the key's pair that belong to it.
pub(crate) struct Target<'m> {
    pub layer: &'m str,
    pub shape: [u64; 2],
    pub rows: Rows,
}

impl Modules {
    /// The linear layers among a component's tensors: every 2-D `….weight` except token
    /// tables. The text encoder's `model.` prefix is dropped, as the encoder drops it. The
    /// transformer's layers also answer to `original_names`, where its family has them.
    pub fn from_sizes(
        component: Component,
        original_names: Option<OriginalNames>,
        sizes: &[TensorSize],
    ) -> Modules {
        let mut m = Modules::default();
        for t in sizes {
            let name = match component {
                Component::TextEncoder => t.name.strip_prefix("model.").unwrap_or(&t.name),
                Component::Transformer => &t.name,
            };
            let Some(module) = name.strip_suffix(".weight") else {
                continue;
            };
            if t.shape.len() != 2 || module.ends_with("embed_tokens") {
                continue;
            }
            m.flat.insert(layout::flatten(module), module.to_string());
            m.shapes
                .insert(module.to_string(), [t.shape[0], t.shape[1]]);
        }
        let originals = original_names.filter(|_| component == Component::Transformer);
        if let Some(original_linear) = originals {
            for module in m.shapes.keys() {
                if let Some((original, rows)) = original_linear(module) {
                    m.flat.insert(layout::flatten(&original), original.clone());
                    let stands_for = m.originals.entry(original).or_default();
                    stands_for.push((module.clone(), rows));
                }
            }
        }
        m
    }

    /// The layers `key` names (several for a fused original layer), each with its `[out, in]`;
    /// empty when it names none.
    pub(crate) fn resolve(&self, key: &ModuleKey) -> Vec<Target<'_>> {
        let dotted = match key {
            ModuleKey::Dotted(d) => Some(d.as_str()),
            ModuleKey::Flat(f) => self.flat.get(f).map(String::as_str),
        };
        let Some(dotted) = dotted else {
            return Vec::new();
        };
        let target = |layer: &str, rows: Rows| {
            let (layer, &shape) = self.shapes.get_key_value(layer)?;
            Some(Target { layer, shape, rows })
        };
        // The first parts of a fused layer: the layers holding only those parts, their rows
        // counted among the first `n` parts alone.
        if let Some((base, n)) = layout::leading_parts(dotted) {
            let Some(layers) = self.originals.get(base) else {
                return Vec::new();
            };
            return (layers.iter())
                .filter(|(_, r)| r.parts.iter().all(|&p| p < n))
                .filter_map(|(l, r)| {
                    target(
                        l,
                        Rows {
                            of: n,
                            parts: r.parts,
                        },
                    )
                })
                .collect();
        }
        match self.originals.get(dotted) {
            Some(layers) => layers.iter().filter_map(|(l, r)| target(l, *r)).collect(),
            None => target(dotted, Rows::WHOLE).into_iter().collect(),
        }
    }

    /// The layer whose name is nearest `key` as the key spells it.
    fn closest(&self, key: &ModuleKey) -> Option<&str> {
        let spelled = |dotted: &str| match key {
            ModuleKey::Dotted(_) => dotted.to_string(),
            ModuleKey::Flat(_) => layout::flatten(dotted),
        };
        (self.shapes.keys())
            .chain(self.originals.keys())
            .min_by_key(|m| layout::edit_distance(key.as_str(), &spelled(m)))
            .map(String::as_str)
    }
}

/// Every pair bound to the model, by component and layer; several per layer when LoRAs stack.
#[derive(Default, Clone)]
pub struct Adapters {
    by_layer: HashMap<(Component, String), Vec<LoraPair>>,
    /// What was applied, for metadata.
    pub applied: Vec<Applied>,
}

/// One file as applied.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Applied {
    pub file: PathBuf,
    /// The file's stem, as A1111 names LoRAs.
    pub name: String,
    pub scale: f32,
    pub layout: Layout,
    pub layers: usize,
    /// A1111's LoRA hash (the addnet hash or the trainer's `sshs_model_hash`), first 12 hex.
    pub hash: String,
    /// Keys skipped under `--lora-lenient`.
    pub skipped: Vec<String>,
}

/// A LoRA ready to bind: its file read and checked, with the scale it is applied at.
pub struct Input {
    pub file: LoraFile,
    pub scale: f32,
    /// A1111's LoRA hash of the file, first 12 hex.
    pub hash: String,
    /// Keys that name no layer are skipped rather than refused.
    pub lenient: bool,
}

impl Input {
    /// Reads the file `spec` names.
    pub fn read(spec: &LoraSpec, lenient: bool) -> Result<Input, Error> {
        Ok(Input {
            file: LoraFile::read(&spec.path, lenient)?,
            scale: spec.scale,
            hash: a1111_hash(&spec.path),
            lenient,
        })
    }
}

/// The linear layers of a model a LoRA may target, by component.
pub struct Targets {
    text_encoder: Modules,
    transformer: Modules,
}

/// One pair of a file with the layer it targets.
pub struct Bound<'f> {
    pub component: Component,
    pub layer: String,
    pub pair: &'f StoredPair,
    /// The rows of the pair's up half that belong to the layer (all but for a fused layer).
    pub rows: Rows,
}

impl Targets {
    /// The linear layers among the text encoder's and the transformer's tensors of a model
    /// whose transformer's layers also answer to `original_names` (its family's).
    pub fn new(
        original_names: Option<OriginalNames>,
        text_encoder: &[TensorSize],
        transformer: &[TensorSize],
    ) -> Targets {
        Targets {
            text_encoder: Modules::from_sizes(Component::TextEncoder, original_names, text_encoder),
            transformer: Modules::from_sizes(Component::Transformer, original_names, transformer),
        }
    }

    /// Every pair of `input`'s file with the layer it targets, and the keys skipped. A key
    /// that names no layer, or a pair whose shape does not fit its layer, is an error, unless
    /// the input is lenient (then the key is skipped and listed).
    pub fn resolve<'f>(&self, input: &'f Input) -> Result<(Vec<Bound<'f>>, Vec<String>), Error> {
        let file = &input.file;
        let mut skipped = file.skipped.clone();
        let mut bound = Vec::new();
        for ((component, key), pair) in &file.pairs {
            let index = match component {
                Component::TextEncoder => &self.text_encoder,
                Component::Transformer => &self.transformer,
            };
            let targets = check_targets(file, *component, key, pair, index, input.lenient)?;
            if targets.is_empty() {
                skipped.push(pair.down.name.clone());
                skipped.push(pair.up.name.clone());
            }
            bound.extend(targets.into_iter().map(|t| Bound {
                component: *component,
                layer: t.layer.to_string(),
                pair,
                rows: t.rows,
            }));
        }
        Ok((bound, skipped))
    }
}

impl Adapters {
    /// Reads each file, resolves its keys against the model's linear layers (`sizes`: the
    /// text encoder's and the transformer's tensors) and binds its pairs in `dtype`. A key that
    /// names no layer, or a pair whose shape does not fit its layer, is an error, unless
    /// `lenient` (then the key is skipped and listed).
    pub fn load(
        specs: &[LoraSpec],
        original_names: Option<OriginalNames>,
        text_encoder: &[TensorSize],
        transformer: &[TensorSize],
        lenient: bool,
        dtype: Dtype,
    ) -> Result<Adapters, Error> {
        let inputs = specs
            .iter()
            .map(|spec| Input::read(spec, lenient))
            .collect::<Result<Vec<_>, _>>()?;
        let targets = Targets::new(original_names, text_encoder, transformer);
        Adapters::bind(&inputs, &targets, dtype)
    }

    /// Binds every input's pairs, in order, to the layers they target, in `dtype`.
    pub fn bind(inputs: &[Input], targets: &Targets, dtype: Dtype) -> Result<Adapters, Error> {
        let mut adapters = Adapters::default();
        for input in inputs {
            let (bound, skipped) = targets.resolve(input)?;
            let file = &input.file;
            for b in &bound {
                let scale = input.scale as f64 * b.pair.alpha_scale();
                let pair = LoraPair {
                    down: file.array(&b.pair.down)?.astype(dtype)?,
                    up: rows_of(&file.array(&b.pair.up)?, b.rows)?.astype(dtype)?,
                    scale: scale as f32,
                };
                adapters
                    .by_layer
                    .entry((b.component, b.layer.clone()))
                    .or_default()
                    .push(pair);
            }
            adapters.applied.push(Applied {
                name: file_stem(&file.path),
                file: file.path.clone(),
                scale: input.scale,
                layout: file.layout,
                layers: bound.len(),
                hash: input.hash.clone(),
                skipped,
            });
        }
        Ok(adapters)
    }

    /// The pairs for `component`'s layers, by dotted layer name.
    pub fn for_component(&self, component: &str) -> HashMap<String, Vec<LoraPair>> {
        self.by_layer
            .iter()
            .filter(|((c, _), _)| c.name() == component)
            .map(|((_, layer), pairs)| (layer.clone(), pairs.clone()))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.by_layer.is_empty()
    }
}

/// `up`'s rows that `rows` picks, in its order.
fn rows_of(up: &Array, rows: Rows) -> Result<Array, Error> {
    if rows == Rows::WHOLE {
        return Ok(up.clone());
    }
    // Checked against the layer when the key was resolved.
    let ranges = rows.ranges(up.dim(0) as u64).unwrap_or_default();
    let parts = (ranges.iter())
        .map(|&(start, end)| up.slice_axis(0, start as i32, end as i32))
        .collect::<mlx::Result<Vec<_>>>()?;
    Ok(ops::concatenate(&parts.iter().collect::<Vec<_>>(), 0)?)
}

/// The layers `key` targets, checked against the pair's shapes; none for a key that names no
/// layer when `lenient`.
fn check_targets<'m>(
    file: &LoraFile,
    component: Component,
    key: &ModuleKey,
    pair: &StoredPair,
    modules: &'m Modules,
    lenient: bool,
) -> Result<Vec<Target<'m>>, Error> {
    let err = |reason: String| Error::File {
        path: file.path.clone(),
        reason,
    };
    let targets = modules.resolve(key);
    if targets.is_empty() {
        if lenient {
            return Ok(targets);
        }
        let closest = match modules.closest(key) {
            Some(m) => format!("the closest is `{}`", shown(m)),
            None => format!("the model has no {} layers", component.name()),
        };
        return Err(err(format!(
            "key `{}` names no linear layer of the model's {} ({closest}); pass --lora-lenient to skip such keys",
            shown(&pair.down.name),
            component.name()
        )));
    };
    for t in &targets {
        let [out, inp] = t.shape;
        let rows = t.rows.ranges(pair.out_features());
        let rows_out: u64 = rows.iter().flatten().map(|(start, end)| end - start).sum();
        if pair.in_features() != inp || rows.is_none() || rows_out != out {
            let held = match t.rows == Rows::WHOLE {
                true => String::new(),
                false => format!(" ({} of its {} parts)", t.rows.parts.len(), t.rows.of),
            };
            return Err(err(format!(
                "`{}` {:?} and `{}` {:?} do not fit layer `{}`{held} of shape [out {out}, in {inp}]; is the LoRA for another model?",
                shown(&pair.down.name),
                pair.down.shape,
                shown(&pair.up.name),
                pair.up.shape,
                t.layer
            )));
        }
    }
    Ok(targets)
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A1111's LoRA hash of `path`, first 12 hex; empty when it cannot be computed.
fn a1111_hash(path: &Path) -> String {
    crate::formats::model_hash::hash_file(path)
        .ok()
        .and_then(|h| h.safetensors)
        .map(|st| st.a1111_lora_hash.chars().take(12).collect())
        .unwrap_or_default()
}

/// What `zimage inspect` shows of a LoRA file.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub layout: Layout,
    pub pairs: usize,
    /// Lowest and highest rank.
    pub rank: (u64, u64),
    /// The distinct alphas (none when the file gives none: alpha = rank).
    pub alphas: Vec<f64>,
    /// Target layers with their indices as `*`, with counts, per component.
    pub targets: BTreeMap<String, usize>,
    pub components: Vec<Component>,
}

impl LoraFile {
    pub fn summary(&self) -> Summary {
        let mut alphas: Vec<f64> = self.pairs.values().filter_map(|p| p.alpha).collect();
        alphas.sort_by(f64::total_cmp);
        alphas.dedup();
        let ranks = self.pairs.values().map(StoredPair::rank);
        let mut components: Vec<Component> = self.pairs.keys().map(|(c, _)| *c).collect();
        components.dedup();
        let mut targets = BTreeMap::new();
        for (c, m) in self.pairs.keys() {
            *targets
                .entry(format!("{}: {}", c.name(), generic(m.as_str())))
                .or_insert(0) += 1;
        }
        Summary {
            layout: self.layout,
            pairs: self.pairs.len(),
            rank: (ranks.clone().min().unwrap_or(0), ranks.max().unwrap_or(0)),
            alphas,
            targets,
            components,
        }
    }
}

/// Whether a safetensors header is an adapter's: some key is a LoRA pair's half or another
/// adapter kind's part. Read from the header alone, so a model file is never read whole.
pub fn is_adapter(header: &crate::safetensors::Header) -> bool {
    header.tensors.iter().any(|t| {
        layout::other_kind(&t.name).is_some()
            || layout::parse_key(&t.name).is_some_and(|k| k.part != layout::Part::Alpha)
    })
}

/// A layer name with its block indices as `*`: `layers.*.attention.to_q`.
fn generic(module: &str) -> String {
    let star = |part: &str| {
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            "*".to_string()
        } else {
            part.to_string()
        }
    };
    if module.contains('.') {
        module.split('.').map(star).collect::<Vec<_>>().join(".")
    } else {
        module.split('_').map(star).collect::<Vec<_>>().join("_")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_takes_a_scale_after_the_last_colon() {
        let s = LoraSpec::parse("style.safetensors:0.8").unwrap();
        assert_eq!((s.path, s.scale), (PathBuf::from("style.safetensors"), 0.8));
        let s = LoraSpec::parse("a:b.safetensors").unwrap();
        assert_eq!((s.path, s.scale), (PathBuf::from("a:b.safetensors"), 1.0));
        assert!(LoraSpec::parse(":1").is_err());
        assert!(LoraSpec::parse("x:nan").is_err());
        assert!(LoraSpec::parse("x:1e9").is_err());
    }

    #[test]
    fn targets_group_block_indices() {
        assert_eq!(
            generic("layers.12.attention.to_q"),
            "layers.*.attention.to_q"
        );
        assert_eq!(
            generic("layers_3_feed_forward_w1"),
            "layers_*_feed_forward_w1"
        );
    }

    #[test]
    fn hostile_names_are_escaped_and_cut() {
        assert_eq!(shown("a\nb"), "a\\nb");
        assert!(shown(&"x".repeat(10_000)).chars().count() <= SHOWN_CHARS + 1);
    }
}
