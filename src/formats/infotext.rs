//! A1111's `parameters` text ("infotext"), written and parsed the way stable-diffusion-webui
//! does it (`modules/processing.py` `create_infotext`, `modules/infotext_utils.py`):
//!
//! ```text
//! <prompt, possibly several lines>
//! Negative prompt: <negative>      (left out when the negative prompt is empty)
//! Steps: 20, Sampler: Euler, CFG scale: 7, Seed: 1234, Size: 512x768, Model hash: 6c6a70ac2a
//! ```
//!
//! The parser is a hand-written equivalent of A1111's
//! `\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)` under Python's `findall`, with
//! Python's Unicode `\w`, `\s` and `str.strip()`, so that a text parses here as it does in
//! the web UI. It returns the pairs as written (A1111 also splits `Size` into `Size-1` and
//! `Size-2` and fills in defaults; callers can do that from the raw value).

/// A parsed infotext.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Infotext {
    pub prompt: String,
    pub negative_prompt: String,
    /// `Key: value` pairs of the parameter line in order, quoted values unquoted. A key given
    /// twice keeps its first place and its last value, as a Python dict does.
    pub params: Vec<(String, String)>,
}

impl Infotext {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The infotext for a prompt, a negative prompt (empty: no `Negative prompt:` line) and the
/// parameters in order. A pair whose key equals its value is written as the key alone.
pub fn format<K: AsRef<str>, V: AsRef<str>>(
    prompt: &str,
    negative: &str,
    params: &[(K, V)],
) -> String {
    let neg = if negative.is_empty() {
        String::new()
    } else {
        format!("\nNegative prompt: {negative}")
    };
    let line: Vec<String> = params
        .iter()
        .map(|(k, v)| {
            let (k, v) = (k.as_ref(), v.as_ref());
            if k == v {
                k.to_string()
            } else {
                format!("{k}: {}", quote(v))
            }
        })
        .collect();
    py_strip(&format!("{prompt}{neg}\n{}", line.join(", "))).to_string()
}

/// A value as A1111 writes it: unchanged, or as a JSON string (non-ASCII kept) when it holds
/// a `,`, a newline or a `:`, which would otherwise end or split the pair.
pub fn quote(v: &str) -> String {
    if v.contains([',', '\n', ':']) {
        // serde_json escapes exactly what Python's `json.dumps(ensure_ascii=False)` escapes.
        serde_json::to_string(v).expect("strings serialize")
    } else {
        v.to_string()
    }
}

/// Parses an infotext as A1111's `parse_generation_parameters` does. The last line is the
/// parameter line only when it holds at least three pairs; otherwise it belongs to the prompt.
pub fn parse(text: &str) -> Infotext {
    let mut lines: Vec<&str> = py_strip(text).split('\n').collect();
    let last = lines.pop().unwrap_or_default();
    let mut pairs = find_pairs(last);
    if pairs.len() < 3 {
        lines.push(last);
        pairs.clear();
    }
    let mut out = Infotext::default();
    let mut done_with_prompt = false;
    for line in lines {
        let mut line = py_strip(line);
        if let Some(rest) = line.strip_prefix("Negative prompt:") {
            done_with_prompt = true;
            line = py_strip(rest);
        }
        let target = if done_with_prompt {
            &mut out.negative_prompt
        } else {
            &mut out.prompt
        };
        if !target.is_empty() {
            target.push('\n');
        }
        target.push_str(line);
    }
    // Where each key sits in `params`, so that a line of many pairs stays linear.
    let mut place: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (k, v) in pairs {
        // A1111 reads `v[0]`, which raises on an empty value and drops the pair.
        if v.is_empty() {
            continue;
        }
        let v = if v.starts_with('"') && v.ends_with('"') {
            unquote(&v)
        } else {
            v
        };
        match place.get(&k) {
            Some(&i) => out.params[i].1 = v,
            None => {
                place.insert(k.clone(), out.params.len());
                out.params.push((k, v));
            }
        }
    }
    out
}

/// A1111's `unquote`: a JSON string's value, or the text unchanged when it does not parse.
fn unquote(v: &str) -> String {
    serde_json::from_str::<String>(v).unwrap_or_else(|_| v.to_string())
}

/// Every `(key, raw value)` the parameter regex finds in `line`, as Python's `findall`.
///
/// Linear in the line: a failed match tells where the next one can start (every start inside
/// the whitespace or key run it scanned fails the same way), and a quoted value's scan stops at
/// the next unescaped quote, which no later scan passes either.
fn find_pairs(line: &str) -> Vec<(String, String)> {
    let c: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut p = 0;
    while p < c.len() {
        match match_at(&c, p) {
            Ok((end, key, value)) => {
                out.push((key, value));
                p = end.max(p + 1);
            }
            Err(next) => p = next.max(p + 1),
        }
    }
    out
}

/// One match of the parameter regex starting at `p`: (end, key, value), or where the next
/// match can start. No backtracking is needed: `\s` and `\w` are disjoint and `:` is outside
/// the key class, so the greedy key is the only one, and the unquoted value alternative always
/// matches where the quoted one fails.
fn match_at(c: &[char], p: usize) -> Result<(usize, String, String), usize> {
    let mut i = p;
    while c.get(i).is_some_and(|&ch| is_space(ch)) {
        i += 1;
    }
    let key_start = i;
    if !c.get(i).is_some_and(|&ch| is_word(ch)) {
        // Starting anywhere in the whitespace run ends at this same character.
        return Err(i + 1);
    }
    i += 1;
    let run = i;
    while c
        .get(i)
        .is_some_and(|&ch| is_word(ch) || matches!(ch, ' ' | '-' | '/'))
    {
        i += 1;
    }
    if i == run || c.get(i) != Some(&':') {
        // A start later in the run reaches the same end, where `:` is still missing (or the
        // key is shorter still); the end itself may start a match.
        return Err(i);
    }
    let key: String = c[key_start..i].iter().collect();
    i += 1;
    while c.get(i).is_some_and(|&ch| is_space(ch)) {
        i += 1;
    }
    if let Some(close) = quoted_end(c, i) {
        let value: String = c[i..close].iter().collect();
        let end = if c.get(close) == Some(&',') {
            close + 1
        } else {
            close
        };
        return Ok((end, key, value));
    }
    let start = i;
    while c.get(i).is_some_and(|&ch| ch != ',') {
        i += 1;
    }
    let value: String = c[start..i].iter().collect();
    Ok((if i < c.len() { i + 1 } else { i }, key, value))
}

/// `"(?:\\.|[^\\"])+"` followed by `,` or the end: the index just past the closing quote.
fn quoted_end(c: &[char], i: usize) -> Option<usize> {
    if c.get(i) != Some(&'"') {
        return None;
    }
    let mut j = i + 1;
    loop {
        match c.get(j) {
            // `.` matches anything but a newline.
            Some('\\') if c.get(j + 1).is_some_and(|&ch| ch != '\n') => j += 2,
            Some('"') | Some('\\') | None => break,
            Some(_) => j += 1,
        }
    }
    if j == i + 1 || c.get(j) != Some(&'"') {
        return None;
    }
    matches!(c.get(j + 1), None | Some(',')).then_some(j + 1)
}

/// Python's `\w` on `str`: alphanumeric or `_`.
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Python's `str.isspace()`: Rust's whitespace plus the four ASCII separators 0x1C–0x1F.
fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// Python's `str.strip()`.
fn py_strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(line: &str) -> Vec<(String, String)> {
        find_pairs(line)
    }

    fn p(k: &str, v: &str) -> (String, String) {
        (k.into(), v.into())
    }

    #[test]
    fn finds_pairs_as_the_regex_does() {
        assert_eq!(
            pairs("Steps: 20, Sampler: Euler a"),
            vec![p("Steps", "20"), p("Sampler", "Euler a")]
        );
        assert_eq!(
            pairs("Lora hashes: \"a: 1, b: 2\", Xx: y"),
            vec![p("Lora hashes", "\"a: 1, b: 2\""), p("Xx", "y")]
        );
        // A quoted value not followed by `,` falls back to the unquoted alternative.
        assert_eq!(
            pairs("Kk: \"a\" b, Ll: c"),
            vec![p("Kk", "\"a\" b"), p("Ll", "c")]
        );
        // `""` is no quoted value (it needs one character), so it is taken up to the comma.
        assert_eq!(
            pairs("Kk: \"\", Ll: c"),
            vec![p("Kk", "\"\""), p("Ll", "c")]
        );
        // Escaped quotes stay inside the value.
        assert_eq!(
            pairs(r#"Kk: "a\"b", Ll: c"#),
            vec![p("Kk", r#""a\"b""#), p("Ll", "c")]
        );
        // A one-character key does not match; the scan moves on.
        assert_eq!(pairs("a: 1, bc: 2"), vec![p("bc", "2")]);
        assert_eq!(
            pairs("Empty:, Next: x"),
            vec![p("Empty", ""), p("Next", "x")]
        );
        assert_eq!(pairs("Clip-skip/x y: 2"), vec![p("Clip-skip/x y", "2")]);
        assert_eq!(pairs("no pairs here"), vec![]);
    }

    #[test]
    fn strips_like_python() {
        assert_eq!(py_strip("\x1c a \u{3000}\n"), "a");
    }
}
