//! Prompt → token ids for T5's encoder, as transformers 5.23.0's `T5TokenizerFast` gives them
//! and FLUX's pipeline asks for them (flux1-spec §3.1).
//!
//! The model's `tokenizer_2/tokenizer.json` holds the sentencepiece unigram vocabulary and
//! normalisation table (`spiece.model` holds the same and is not needed). transformers 5 does
//! not run that file's pipeline as written: it keeps the vocabulary, the special tokens, the
//! post-processor (`</s>` appended) and, of the normaliser, only the sentencepiece table
//! (`Precompiled`), and splits on whitespace before the `▁` word marking. So leading, trailing
//! and repeated whitespace give no pieces of their own; this module builds the same pipeline.
//! Prompts are cut to the first `length − 1` pieces plus `</s>` and right-padded with `<pad>`
//! to exactly `length` (`max_sequence_length`: 512 for \[dev\], 256 for \[schnell\]).

use crate::text::Error;
use std::path::PathBuf;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;
use tokenizers::utils::padding::{PaddingDirection, PaddingParams, PaddingStrategy};
use tokenizers::utils::truncation::{TruncationDirection, TruncationParams, TruncationStrategy};
use tokenizers::{PreTokenizerWrapper, Tokenizer};

/// The longest window transformers' T5 runs in FLUX (`max_sequence_length` ≤ 512).
pub const MAX_LENGTH: usize = 512;

/// T5's tokenizer, cutting and padding to one window.
pub struct T5Tokenizer {
    inner: Tokenizer,
    length: usize,
}

impl T5Tokenizer {
    /// Loads from the tokenizer files `read(name)` returns (`None` when absent), as stored in a
    /// model's `tokenizer_2/` folder (`tokenizer.json`; `tokenizer_config.json` for the pad
    /// token, `<pad>` when it names none), for prompts of exactly `length` ids.
    pub fn from_files(
        read: impl Fn(&str) -> Result<Option<Vec<u8>>, String>,
        length: usize,
    ) -> Result<T5Tokenizer, Error> {
        let read = |name: &str| read(name).map_err(Error::Read);
        let fail = |reason: String| Error::Load {
            dir: PathBuf::from("tokenizer_2"),
            reason,
        };
        if !(1..=MAX_LENGTH).contains(&length) {
            return Err(fail(format!(
                "a T5 window of {length} ids; it must be within 1..={MAX_LENGTH}"
            )));
        }
        let json = read("tokenizer.json")?
            .ok_or_else(|| fail("T5's tokenizer needs `tokenizer.json`".into()))?;
        let mut inner =
            Tokenizer::from_bytes(&json).map_err(|e| fail(format!("`tokenizer.json`: {e}")))?;
        let file: serde_json::Value =
            serde_json::from_slice(&json).map_err(|e| fail(format!("`tokenizer.json`: {e}")))?;
        let table = sentencepiece_table(&file).map_err(fail)?;
        inner.with_normalizer(table);
        let pre: Vec<PreTokenizerWrapper> = vec![
            WhitespaceSplit.into(),
            Metaspace::new('▁', PrependScheme::Always, true).into(),
        ];
        inner.with_pre_tokenizer(Some(Sequence::new(pre)));
        if inner.get_post_processor().is_none() {
            return Err(fail(
                "`tokenizer.json` has no `post_processor` to append `</s>`".into(),
            ));
        }

        let pad_token = match read("tokenizer_config.json")? {
            Some(bytes) => pad_token(&bytes).map_err(fail)?,
            None => "<pad>".to_string(),
        };
        let pad_id = inner.token_to_id(&pad_token).ok_or_else(|| {
            fail(format!(
                "the pad token `{pad_token}` is not in `tokenizer.json`"
            ))
        })?;
        inner
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| fail(format!("truncation: {e}")))?;
        inner.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::Fixed(length),
            direction: PaddingDirection::Right,
            pad_to_multiple_of: None,
            pad_id,
            pad_type_id: 0,
            pad_token,
        }));
        Ok(T5Tokenizer { inner, length })
    }

    /// The window every prompt is cut or padded to.
    pub fn length(&self) -> usize {
        self.length
    }

    /// The ids of `prompt` as FLUX's pipeline feeds them to T5: the first pieces, `</s>`, then
    /// padding, exactly [`T5Tokenizer::length`] of them.
    pub fn encode(&self, prompt: &str) -> Result<Vec<u32>, Error> {
        let enc = self
            .inner
            .encode(prompt, true)
            .map_err(|e| Error::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }
}

/// The sentencepiece normalisation table of `tokenizer.json`'s normaliser (alone or in a
/// sequence), the one part of it transformers keeps; `None` when it has none.
fn sentencepiece_table(file: &serde_json::Value) -> Result<Option<NormalizerWrapper>, String> {
    let normalizer = &file["normalizer"];
    let parts = match normalizer["type"].as_str() {
        Some("Sequence") => normalizer["normalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        Some(_) => vec![normalizer.clone()],
        None => Vec::new(),
    };
    let Some(table) = parts.into_iter().find(|n| n["type"] == "Precompiled") else {
        return Ok(None);
    };
    serde_json::from_value(table)
        .map(Some)
        .map_err(|e| format!("`tokenizer.json` `normalizer` `Precompiled`: {e}"))
}

/// `tokenizer_config.json`'s `pad_token` (a string, or an object with its `content`).
fn pad_token(config: &[u8]) -> Result<String, String> {
    let config: serde_json::Value =
        serde_json::from_slice(config).map_err(|e| format!("`tokenizer_config.json`: {e}"))?;
    let Some(pad) = config.get("pad_token") else {
        return Ok("<pad>".to_string());
    };
    pad.as_str()
        .or_else(|| pad.get("content").and_then(|c| c.as_str()))
        .map(str::to_string)
        .ok_or_else(|| format!("`tokenizer_config.json` `pad_token` is {pad}, not a token"))
}
