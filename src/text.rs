//! Prompt → token ids for the Qwen3 text encoder.
//!
//! The tokenizer is `tokenizer/tokenizer.json` when the model ships one; otherwise it is built
//! from the byte-level BPE files the Qwen2 tokenizer also ships (`vocab.json`, `merges.txt`) and
//! the added tokens of `tokenizer_config.json`, with Qwen2's pre-tokenizer. Both give the same ids.
//!
//! Qwen3's chat template with one user message and the generation prompt, thinking enabled or
//! disabled as the family's pipeline applies it, renders to a fixed string, so no template
//! engine is needed.

use std::collections::HashMap;
use std::path::PathBuf;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

/// Qwen2's pre-tokenizer pattern (single digits, unlike GPT-4's `\p{N}{1,3}`).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Longest token sequence the pipeline encodes (`max_sequence_length`); longer prompts are cut.
pub const MAX_SEQUENCE_LENGTH: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("tokenizer in `{}`: {reason}", dir.display())]
    Load { dir: PathBuf, reason: String },
    #[error("tokenizing the prompt failed: {0}")]
    Encode(String),
    /// A tokenizer file could not be read (the message names it).
    #[error("{0}")]
    Read(String),
}

/// The prompt as the pipeline feeds it to the tokenizer.
pub fn chat_template(prompt: &str) -> String {
    format!("<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
}

/// The prompt with thinking disabled: Qwen3's template closes an empty think block after the
/// generation prompt (the FLUX.2 spec §2.1).
pub fn chat_template_no_thinking(prompt: &str) -> String {
    format!("{}<think>\n\n</think>\n\n", chat_template(prompt))
}

/// The Qwen tokenizer of a model's `tokenizer/` folder.
pub struct PromptTokenizer {
    inner: Tokenizer,
}

impl PromptTokenizer {
    /// Loads from the tokenizer files `read(name)` returns (`None` when absent), as stored in
    /// a model's `tokenizer/` folder; a file that cannot be read is an error, not an absence.
    pub fn from_files(
        read: impl Fn(&str) -> Result<Option<Vec<u8>>, String>,
    ) -> Result<PromptTokenizer, Error> {
        let read = |name: &str| read(name).map_err(Error::Read);
        let fail = |reason: String| Error::Load {
            dir: PathBuf::from("tokenizer"),
            reason,
        };
        if let Some(json) = read("tokenizer.json")? {
            let inner =
                Tokenizer::from_bytes(&json).map_err(|e| fail(format!("`tokenizer.json`: {e}")))?;
            return Ok(PromptTokenizer { inner });
        }
        let (Some(vocab), Some(merges)) = (read("vocab.json")?, read("merges.txt")?) else {
            return Err(fail(
                "needs `tokenizer.json`, or `vocab.json` and `merges.txt`".into(),
            ));
        };
        let vocab: HashMap<String, u32> =
            serde_json::from_slice(&vocab).map_err(|e| fail(format!("`vocab.json`: {e}")))?;
        let merges = parse_merges(&merges).map_err(fail)?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab.into_iter().collect::<Vocab>(), merges)
            .build()
            .map_err(|e| fail(format!("`vocab.json`/`merges.txt`: {e}")))?;
        let mut inner = Tokenizer::new(bpe);
        inner.with_normalizer(Some(NFC));
        let split = Split::new(
            SplitPattern::Regex(QWEN2_PATTERN.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| fail(format!("pre-tokenizer pattern: {e}")))?;
        let pre: Vec<PreTokenizerWrapper> =
            vec![split.into(), ByteLevel::new(false, true, false).into()];
        inner.with_pre_tokenizer(Some(Sequence::new(pre)));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let config = read("tokenizer_config.json")?
            .ok_or_else(|| fail("no `tokenizer_config.json`".into()))?;
        let added = added_tokens(&config).map_err(fail)?;
        let tokens: Vec<AddedToken> = added
            .into_iter()
            .map(|(content, special)| AddedToken::from(content, special))
            .collect();
        inner.add_special_tokens(&tokens);
        Ok(PromptTokenizer { inner })
    }

    /// The largest token id the tokenizer can produce, if it has any tokens.
    pub fn max_id(&self) -> Option<u64> {
        self.inner
            .get_vocab(true)
            .values()
            .max()
            .map(|&id| id as u64)
    }

    /// The id of one token of the vocabulary (a special token such as `<|endoftext|>`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Ids of `text` as is (no template), without special-token additions.
    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>, Error> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Ids of the templated prompt, truncated to [`MAX_SEQUENCE_LENGTH`] as the pipeline does.
    /// Only as much of a long prompt is tokenized as gives that many: a start of it that ends
    /// where the pre-tokenizer splits, read further only if it gave too few.
    pub fn encode_prompt(&self, prompt: &str) -> Result<Vec<u32>, Error> {
        self.encode_templated(prompt, &|p| Ok(chat_template(p)), MAX_SEQUENCE_LENGTH)
    }

    /// Ids of `prompt` in `template`, cut to `max_len` as the tokenizer's truncation does. Only
    /// as much of a long prompt is tokenized as gives that many: a start of it that ends where
    /// the pre-tokenizer splits, read further only if it gave too few.
    pub fn encode_templated(
        &self,
        prompt: &str,
        template: &dyn Fn(&str) -> Result<String, Error>,
        max_len: usize,
    ) -> Result<Vec<u32>, Error> {
        // The template's own tokens come on top of a cut prompt's.
        let template_len = self.encode_raw(&template("")?)?.len();
        let mut read = FIRST_READ_BYTES;
        loop {
            let head = split_prefix(prompt, read);
            let mut ids = self.encode_raw(&template(head)?)?;
            if head.len() == prompt.len() || ids.len() >= max_len + template_len {
                ids.truncate(max_len);
                return Ok(ids);
            }
            read = read.saturating_mul(4);
        }
    }
}

/// Bytes of a prompt tokenized first: 512 tokens of ordinary text take 2–3 KB.
const FIRST_READ_BYTES: usize = MAX_SEQUENCE_LENGTH * 16;

/// The longest start of `text` of at most `max` bytes that ends where Qwen's pre-tokenizer
/// splits the whole text, so that its tokens are the first tokens of the whole: before a space
/// that follows a character other than whitespace (a space is a starter for NFC as well). The
/// whole text when it is no longer, or has no such place.
fn split_prefix(text: &str, max: usize) -> &str {
    let bytes = text.as_bytes();
    if bytes.len() <= max {
        return text;
    }
    (1..=max)
        .rev()
        .find(|&i| {
            bytes[i] == b' ' && (text[..i].chars().next_back()).is_some_and(|c| !c.is_whitespace())
        })
        .map_or(text, |i| &text[..i])
}

/// The most bytes a tokenizer file may hold, and its name for errors: `tokenizer.json` holds
/// the whole vocabulary and merges (Qwen's is 11 MB); the others are a fraction of that.
pub fn file_limit(name: &str) -> (u64, &'static str) {
    match name {
        "tokenizer.json" => (64 << 20, "tokenizer file"),
        _ => (16 << 20, "tokenizer file"),
    }
}

/// `merges.txt`: one `left right` pair a line after an optional `#version` line.
pub(crate) fn parse_merges(bytes: &[u8]) -> Result<Vec<(String, String)>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("`merges.txt` is not UTF-8: {e}"))?;
    text.lines()
        .enumerate()
        .filter(|(i, l)| !(l.is_empty() || *i == 0 && l.starts_with("#version")))
        .map(|(i, l)| {
            l.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| format!("`merges.txt` line {} is not a pair", i + 1))
        })
        .collect()
}

/// `added_tokens_decoder` of `tokenizer_config.json`, in id order, as (content, special).
fn added_tokens(config: &[u8]) -> Result<Vec<(String, bool)>, String> {
    let json: serde_json::Value =
        serde_json::from_slice(config).map_err(|e| format!("`tokenizer_config.json`: {e}"))?;
    let Some(map) = json.get("added_tokens_decoder").and_then(|v| v.as_object()) else {
        return Err("`tokenizer_config.json` has no `added_tokens_decoder`".into());
    };
    let mut tokens: Vec<(u64, String, bool)> = Vec::new();
    for (id, entry) in map {
        let id: u64 = id
            .parse()
            .map_err(|_| format!("`added_tokens_decoder` key `{id}` is not an id"))?;
        let content = entry
            .get("content")
            .and_then(|c| c.as_str())
            .ok_or_else(|| format!("added token {id} has no `content`"))?;
        let special = entry
            .get("special")
            .and_then(|s| s.as_bool())
            .unwrap_or(false);
        tokens.push((id, content.to_string(), special));
    }
    tokens.sort();
    Ok(tokens.into_iter().map(|(_, c, s)| (c, s)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> PromptTokenizer {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/z-image-tiny/tokenizer");
        PromptTokenizer::from_files(|name| Ok(std::fs::read(dir.join(name)).ok())).unwrap()
    }

    #[test]
    fn qwen_ids_for_the_reference_prompts() {
        let t = tiny();
        assert_eq!(
            t.encode_raw("<|im_start|>user\n").unwrap(),
            vec![151644, 872, 198]
        );
        assert_eq!(
            t.encode_prompt("a red fox in the snow").unwrap(),
            vec![
                151644, 872, 198, 64, 2518, 38835, 304, 279, 11794, 151645, 198, 151644, 77091, 198
            ]
        );
        assert_eq!(
            t.encode_prompt("A cat holding a sign that says hello world")
                .unwrap(),
            vec![
                151644, 872, 198, 32, 8251, 9963, 264, 1841, 429, 2727, 23811, 1879, 151645, 198,
                151644, 77091, 198
            ]
        );
        assert_eq!(t.encode_prompt("").unwrap().len(), 8);
    }

    #[test]
    fn long_prompts_are_tokenized_in_part_as_if_whole() {
        let t = tiny();
        let whole = |p: &str| {
            let mut ids = t.encode_raw(&chat_template(p)).unwrap();
            ids.truncate(MAX_SEQUENCE_LENGTH);
            ids
        };
        let words = "a red fox, 12 jumps!  Über den   Schnee\n\tthen ".repeat(2000);
        let spaceless = "x".repeat(3 * FIRST_READ_BYTES);
        let long_words = format!("{} tail", "wolf".repeat(5000)).repeat(3);
        for prompt in [words.as_str(), &spaceless, &long_words] {
            assert_eq!(t.encode_prompt(prompt).unwrap(), whole(prompt));
        }
        assert!(split_prefix(&words, FIRST_READ_BYTES).len() <= FIRST_READ_BYTES);
    }

    #[test]
    fn long_prompts_are_cut_at_512() {
        let t = tiny();
        assert_eq!(
            t.encode_prompt(&"fox ".repeat(600)).unwrap().len(),
            MAX_SEQUENCE_LENGTH
        );
    }
}
