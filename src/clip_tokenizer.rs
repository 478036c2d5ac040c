//! Prompt → token ids for CLIP's text model, as transformers 5.23.0's `CLIPTokenizer` gives
//! them and FLUX's first pipelines ask for them (flux1-spec §2.1).
//!
//! Black Forest Labs' repositories ship CLIP's tokenizer as `vocab.json` + `merges.txt` (no
//! `tokenizer.json`), with `tokenizer_config.json` naming the special tokens and the window
//! (`model_max_length`, 77). transformers builds the same byte-level BPE from those files every
//! time, and so does this module:
//! - normalise: NFC, every whitespace run to one space, lower case;
//! - split by CLIP's pattern (contractions, letter runs, single digits, other symbol runs;
//!   whitespace dropped), then to byte-level symbols;
//! - BPE with `</w>` closing each word;
//! - `<|startoftext|>` + at most `window − 2` pieces + `<|endoftext|>`, right-padded with the
//!   pad token to exactly the window (`padding="max_length"`, `truncation=True`).

use crate::text::{parse_merges, Error};
use std::collections::HashMap;
use std::path::PathBuf;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::ReplacePattern;
use tokenizers::normalizers::{Lowercase, Replace, Sequence as Normalizers, NFC};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::roberta::RobertaProcessing;
use tokenizers::utils::padding::{PaddingDirection, PaddingParams, PaddingStrategy};
use tokenizers::utils::truncation::{TruncationDirection, TruncationParams, TruncationStrategy};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

/// CLIP's split: contractions, letter runs, single digits, runs of other non-space symbols.
/// The special tokens come first so that they are never cut.
const CLIP_PATTERN: &str =
    r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";

/// `CLIPTokenizer`'s defaults, for the tokens a config does not name.
const DEFAULT_BOS: &str = "<|startoftext|>";
const DEFAULT_EOS: &str = "<|endoftext|>";

/// CLIP's tokenizer, with its window's truncation and padding.
pub struct ClipTokenizer {
    inner: Tokenizer,
    window: usize,
}

impl ClipTokenizer {
    /// Loads from the tokenizer files `read(name)` returns (`None` when absent), as stored in a
    /// model's `tokenizer/` folder: `vocab.json`, `merges.txt`, `tokenizer_config.json` and, for
    /// the special tokens it does not name, `special_tokens_map.json`.
    pub fn from_files(
        read: impl Fn(&str) -> Result<Option<Vec<u8>>, String>,
    ) -> Result<ClipTokenizer, Error> {
        let read = |name: &str| read(name).map_err(Error::Read);
        let fail = |reason: String| Error::Load {
            dir: PathBuf::from("tokenizer"),
            reason,
        };
        let (Some(vocab), Some(merges)) = (read("vocab.json")?, read("merges.txt")?) else {
            return Err(fail(
                "CLIP's tokenizer needs `vocab.json` and `merges.txt`".into(),
            ));
        };
        let config = read("tokenizer_config.json")?
            .ok_or_else(|| fail("no `tokenizer_config.json`".into()))?;
        let config = TokenizerConfig::parse(&config, read("special_tokens_map.json")?.as_deref())
            .map_err(fail)?;

        let vocab: HashMap<String, u32> =
            serde_json::from_slice(&vocab).map_err(|e| fail(format!("`vocab.json`: {e}")))?;
        let id = |token: &str, key: &str| {
            vocab.get(token).copied().ok_or_else(|| {
                fail(format!(
                    "`tokenizer_config.json` `{key}` `{token}` is not in `vocab.json`"
                ))
            })
        };
        let (bos, eos, pad) = (
            id(&config.bos, "bos_token")?,
            id(&config.eos, "eos_token")?,
            id(&config.pad, "pad_token")?,
        );
        id(&config.unk, "unk_token")?;
        let merges = parse_merges(&merges).map_err(fail)?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab.into_iter().collect::<Vocab>(), merges)
            .continuing_subword_prefix(String::new())
            .end_of_word_suffix("</w>".into())
            .unk_token(config.unk.clone())
            .fuse_unk(false)
            .build()
            .map_err(|e| fail(format!("`vocab.json`/`merges.txt`: {e}")))?;

        let mut inner = Tokenizer::new(bpe);
        let whitespace = Replace::new(ReplacePattern::Regex(r"\s+".into()), " ")
            .map_err(|e| fail(format!("whitespace pattern: {e}")))?;
        inner.with_normalizer(Some(Normalizers::new(vec![
            NFC.into(),
            whitespace.into(),
            Lowercase.into(),
        ])));
        let split = Split::new(
            SplitPattern::Regex(CLIP_PATTERN.into()),
            SplitDelimiterBehavior::Removed,
            true,
        )
        .map_err(|e| fail(format!("pre-tokenizer pattern: {e}")))?;
        // transformers' `ByteLevel(add_prefix_space=False)`: offsets trimmed, GPT-2's split on.
        let pre: Vec<PreTokenizerWrapper> =
            vec![split.into(), ByteLevel::new(false, true, true).into()];
        inner.with_pre_tokenizer(Some(Sequence::new(pre)));
        inner.with_post_processor(Some(
            RobertaProcessing::new((config.eos.clone(), eos), (config.bos.clone(), bos))
                .trim_offsets(false)
                .add_prefix_space(false),
        ));
        let (special, plain): (Vec<AddedToken>, Vec<AddedToken>) =
            config.added.into_iter().partition(|t| t.special);
        inner.add_special_tokens(&special);
        inner.add_tokens(&plain);

        let window = config.window;
        // Room for the two special tokens and at least one piece.
        if !(3..=1 << 16).contains(&window) {
            return Err(fail(format!(
                "`tokenizer_config.json` `model_max_length` is {window}; it must be within 3..=65536"
            )));
        }
        inner
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: window,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| fail(format!("truncation: {e}")))?;
        inner.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::Fixed(window),
            direction: PaddingDirection::Right,
            pad_to_multiple_of: None,
            pad_id: pad,
            pad_type_id: 0,
            pad_token: config.pad,
        }));
        Ok(ClipTokenizer { inner, window })
    }

    /// The window every prompt is cut or padded to (`model_max_length`, 77 for CLIP-L).
    pub fn window(&self) -> usize {
        self.window
    }

    /// The ids of `prompt` as FLUX's pipeline feeds them to CLIP: start token, the first
    /// pieces, end token, padding, exactly [`ClipTokenizer::window`] of them.
    pub fn encode(&self, prompt: &str) -> Result<Vec<u32>, Error> {
        let enc = self
            .inner
            .encode(prompt, true)
            .map_err(|e| Error::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }
}

/// What `tokenizer_config.json` (and `special_tokens_map.json`) say about the tokens.
struct TokenizerConfig {
    bos: String,
    eos: String,
    pad: String,
    unk: String,
    window: usize,
    /// The special tokens matched whole in a prompt, with their flags.
    added: Vec<AddedToken>,
}

impl TokenizerConfig {
    fn parse(config: &[u8], special_map: Option<&[u8]>) -> Result<TokenizerConfig, String> {
        let config: serde_json::Value =
            serde_json::from_slice(config).map_err(|e| format!("`tokenizer_config.json`: {e}"))?;
        let map: serde_json::Value = match special_map {
            Some(bytes) => serde_json::from_slice(bytes)
                .map_err(|e| format!("`special_tokens_map.json`: {e}"))?,
            None => serde_json::Value::Null,
        };
        // A token is a string or, in older saves, an object with its `content`.
        let token = |key: &str, default: &str| -> String {
            let named = |v: &serde_json::Value| -> Option<String> {
                let v = v.get(key)?;
                v.as_str()
                    .or_else(|| v.get("content").and_then(|c| c.as_str()))
                    .map(str::to_string)
            };
            named(&config)
                .or_else(|| named(&map))
                .unwrap_or_else(|| default.to_string())
        };
        let window = match config.get("model_max_length") {
            Some(v) => v.as_u64().ok_or_else(|| {
                format!("`tokenizer_config.json` `model_max_length` is {v}, not a token count")
            })? as usize,
            None => return Err("`tokenizer_config.json` has no `model_max_length`".into()),
        };
        let (bos, eos) = (
            token("bos_token", DEFAULT_BOS),
            token("eos_token", DEFAULT_EOS),
        );
        let (pad, unk) = (
            token("pad_token", DEFAULT_EOS),
            token("unk_token", DEFAULT_EOS),
        );
        let mut added = match config.get("added_tokens_decoder") {
            Some(decoder) => added_tokens(decoder)?,
            None => Vec::new(),
        };
        // transformers adds the named special tokens whether or not the config lists them.
        for name in [&bos, &eos, &pad, &unk] {
            if !added.iter().any(|t| &t.content == name) {
                added.push(AddedToken::from(name.clone(), true).normalized(true));
            }
        }
        Ok(TokenizerConfig {
            bos,
            eos,
            pad,
            unk,
            window,
            added,
        })
    }
}

/// `added_tokens_decoder`: id → token with its flags; in id order.
fn added_tokens(decoder: &serde_json::Value) -> Result<Vec<AddedToken>, String> {
    #[derive(serde::Deserialize)]
    struct Entry {
        content: String,
        #[serde(default)]
        single_word: bool,
        #[serde(default)]
        lstrip: bool,
        #[serde(default)]
        rstrip: bool,
        #[serde(default = "yes")]
        normalized: bool,
        #[serde(default)]
        special: bool,
    }
    fn yes() -> bool {
        true
    }
    let map: HashMap<String, Entry> = serde_json::from_value(decoder.clone())
        .map_err(|e| format!("`tokenizer_config.json` `added_tokens_decoder`: {e}"))?;
    let mut entries: Vec<(u64, Entry)> = map
        .into_iter()
        .map(|(id, e)| {
            id.parse()
                .map(|id| (id, e))
                .map_err(|_| format!("`added_tokens_decoder` key `{id}` is not an id"))
        })
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(|(id, _)| *id);
    Ok(entries
        .into_iter()
        .map(|(_, e)| AddedToken {
            content: e.content,
            single_word: e.single_word,
            lstrip: e.lstrip,
            rstrip: e.rstrip,
            normalized: e.normalized,
            special: e.special,
        })
        .collect())
}
