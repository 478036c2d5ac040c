//! Names and values from outside (paths, request fields, tensor names) as messages print them:
//! control characters escaped, so that an error stays one line and a terminal is not steered,
//! and cut to a few hundred bytes, so that a 5 MB value is not echoed back.

use std::path::Path;

/// The most bytes of one value a message shows.
pub const MAX_BYTES: usize = 300;

/// `text` with control characters escaped (`\n`, `\t`, `\x1b`) and cut at [`MAX_BYTES`].
/// Other characters, quotes and backslashes included, are left as they are.
pub fn text(text: &str) -> String {
    cut(&escape_controls(text), MAX_BYTES)
}

/// A path as [`text`] shows it (bytes that are not UTF-8 as `�`).
pub fn path(path: &Path) -> String {
    text(&path.to_string_lossy())
}

/// `text` with every control character escaped, at any length.
pub fn escape_controls(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars()
        .map(|c| match c {
            '\n' => "\\n".to_string(),
            '\r' => "\\r".to_string(),
            '\t' => "\\t".to_string(),
            c if c.is_control() && (c as u32) < 0x100 => format!("\\x{:02x}", c as u32),
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect()
}

/// A message that quotes a value (`invalid type: string "…", expected a sequence`) with the
/// quoted part cut as [`text`] cuts a value, and the words around it kept.
pub fn message_quoting(message: &str) -> String {
    let message = escape_controls(message);
    match (message.find('"'), message.rfind('"')) {
        (Some(open), Some(close)) if close > open + MAX_BYTES => format!(
            "{}{}{}",
            &message[..=open],
            cut(&message[open + 1..close], MAX_BYTES),
            &message[close..]
        ),
        _ => message,
    }
}

/// `text` cut at a character boundary within `max` bytes, saying how long it was.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_long_values_cut() {
        assert_eq!(text("a\nb\x1b[31m\u{85}"), "a\\nb\\x1b[31m\\x85");
        assert_eq!(text("plain `x` \\ é"), "plain `x` \\ é");
        let long = "é".repeat(1000);
        let shown = text(&long);
        assert!(shown.len() < MAX_BYTES + 40, "{}", shown.len());
        assert!(shown.ends_with("… (2000 bytes in all)"), "{shown}");
        let m = format!(
            "invalid type: string \"{}\", expected a sequence",
            "A".repeat(5000)
        );
        let shown = message_quoting(&m);
        assert!(shown.len() < 400, "{shown}");
        assert!(shown.ends_with("in all)\", expected a sequence"), "{shown}");
    }
}
