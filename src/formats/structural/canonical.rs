//! Metadata values as weight-inspect canonicalises them. Each value becomes a string of its
//! own (strings quoted and escaped, floats as their bit pattern), and that string is then
//! written as a JSON string: the double encoding seen in the canonical JSON.

use serde_json::{Map, Value};

/// A metadata value after weight-inspect's mapping from JSON.
#[derive(Debug, Clone)]
pub enum CanonicalValue {
    Null,
    Bool(bool),
    Int(i64),
    /// A number that is not an `i64`: a fraction, an exponent, or a `u64` above `i64::MAX`.
    Float(f64),
    /// A JSON string, or an array or object held as its compact JSON with sorted keys.
    String(String),
}

/// Floats compare by bits, so that NaN equals itself and `0.0` differs from `-0.0`, as the
/// canonical strings do.
impl PartialEq for CanonicalValue {
    fn eq(&self, other: &Self) -> bool {
        use CanonicalValue::*;
        match (self, other) {
            (Null, Null) => true,
            (Bool(a), Bool(b)) => a == b,
            (Int(a), Int(b)) => a == b,
            (Float(a), Float(b)) => a.to_bits() == b.to_bits(),
            (String(a), String(b)) => a == b,
            _ => false,
        }
    }
}

impl CanonicalValue {
    pub fn from_json(value: &Value) -> CanonicalValue {
        match value {
            Value::Null => CanonicalValue::Null,
            Value::Bool(b) => CanonicalValue::Bool(*b),
            Value::String(s) => CanonicalValue::String(s.clone()),
            Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => CanonicalValue::Int(i),
                (None, Some(f)) => CanonicalValue::Float(f),
                (None, None) => CanonicalValue::String(n.to_string()),
            },
            Value::Array(_) | Value::Object(_) => CanonicalValue::String(sorted_compact(value)),
        }
    }

    /// The canonical string, before it is written as a JSON string.
    pub fn canonical(&self) -> String {
        match self {
            CanonicalValue::Null => "null".into(),
            CanonicalValue::Bool(b) => b.to_string(),
            CanonicalValue::Int(i) => i.to_string(),
            CanonicalValue::Float(f) => f.to_bits().to_string(),
            CanonicalValue::String(s) => format!("\"{}\"", escape(s)),
        }
    }
}

/// weight-inspect's own escaping, which differs from JSON's: only `\n`, `\r` and `\t` have
/// short forms, and DEL (0x7F) is escaped along with the C0 controls.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_ascii_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Compact JSON with every object's keys sorted bytewise. Our `serde_json` keeps insertion
/// order, and weight-inspect's sorts, so the value is rebuilt in sorted order first.
pub fn sorted_compact(value: &Value) -> String {
    sorted(value).to_string()
}

fn sorted(value: &Value) -> Value {
    match value {
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let mut out = Map::new();
            for (k, v) in entries {
                out.insert(k.clone(), sorted(v));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(v: Value) -> String {
        CanonicalValue::from_json(&v).canonical()
    }

    #[test]
    fn scalars() {
        assert_eq!(canon(json!(null)), "null");
        assert_eq!(canon(json!(true)), "true");
        assert_eq!(canon(json!(false)), "false");
        assert_eq!(canon(json!(42)), "42");
        assert_eq!(canon(json!(-7)), "-7");
        assert_eq!(canon(json!(i64::MAX)), i64::MAX.to_string());
        assert_eq!(canon(json!(1.5)), 1.5f64.to_bits().to_string());
        assert_eq!(canon(json!(1.5)), "4609434218613702656");
        // Above i64::MAX a u64 is no longer an Int: it is taken as an f64.
        assert_eq!(
            canon(json!(u64::MAX)),
            (u64::MAX as f64).to_bits().to_string()
        );
        assert_eq!(canon(json!(u64::MAX)), "4895412794951729152");
    }

    #[test]
    fn strings_are_quoted_and_escaped() {
        assert_eq!(canon(json!("pt")), "\"pt\"");
        assert_eq!(canon(json!("a\"b\\c")), r#""a\"b\\c""#);
        assert_eq!(canon(json!("l1\nl2\r\t")), r#""l1\nl2\r\t""#);
        assert_eq!(
            canon(json!("\u{0}\u{1}\u{8}\u{c}\u{1f}\u{7f}")),
            r#""\u0000\u0001\u0008\u000c\u001f\u007f""#
        );
        assert_eq!(canon(json!("é ✓ \u{80}")), "\"é ✓ \u{80}\"");
    }

    #[test]
    fn arrays_and_objects_are_sorted_compact_json() {
        let v: Value =
            serde_json::from_str(r#"{"z": [1, 2.5, "s"], "a": {"y": null, "b": true}}"#).unwrap();
        assert_eq!(
            canon(v),
            r#""{\"a\":{\"b\":true,\"y\":null},\"z\":[1,2.5,\"s\"]}""#
        );
        assert_eq!(canon(json!([])), r#""[]""#);
    }

    #[test]
    fn floats_compare_by_bits() {
        assert_eq!(
            CanonicalValue::Float(f64::NAN),
            CanonicalValue::Float(f64::NAN)
        );
        assert_ne!(CanonicalValue::Float(0.0), CanonicalValue::Float(-0.0));
        // Same canonical text, different kinds: weight-inspect tells them apart.
        let bits = 1.0f64.to_bits() as i64;
        assert_ne!(CanonicalValue::Int(bits), CanonicalValue::Float(1.0));
        assert_eq!(
            CanonicalValue::Int(bits).canonical(),
            CanonicalValue::Float(1.0).canonical()
        );
    }
}
