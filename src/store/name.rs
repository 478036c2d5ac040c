//! Model names, parsed the way Ollama parses them.
//!
//! `z-image` is `registry.ollama.ai/library/z-image:latest`; `x/z-image-turbo` keeps its
//! namespace; `host:port/ns/model:tag` names a host. The tag is split off only when the last
//! `:` comes after the last `/`. Every part is checked so that no name can reach outside the
//! store: letters, digits, `_`, `-` and `.`, starting with a letter, digit or `_`.

use std::fmt;
use std::path::PathBuf;

/// The host of a name that gives none: Ollama's registry.
pub const DEFAULT_HOST: &str = "registry.ollama.ai";
/// The namespace of a name that gives none.
pub const DEFAULT_NAMESPACE: &str = "library";
/// The tag of a name that gives none.
pub const DEFAULT_TAG: &str = "latest";

/// A model's full name, every part present and checked; [`ModelName::short`] spells it back.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelName {
    /// The registry (`registry.ollama.ai`, or `host:port`).
    pub host: String,
    /// The namespace (`library`, or a user's).
    pub namespace: String,
    /// The model (`z-image-turbo`).
    pub model: String,
    /// The tag (`latest`, `bf16`).
    pub tag: String,
}

/// A name that cannot be a model's.
#[derive(Debug, thiserror::Error)]
#[error("invalid model name `{name}`: {reason}")]
pub struct NameError {
    /// The name given, with characters that cannot be shown escaped.
    pub name: String,
    /// Which part is wrong, and how.
    pub reason: String,
}

impl ModelName {
    /// Parses a name as Ollama does (`z-image`, `x/z-image:tiny`, `host:port/ns/model:tag`),
    /// filling in the defaults.
    pub fn parse(name: &str) -> Result<ModelName, NameError> {
        let err = |reason: &str| NameError {
            name: printable(name),
            reason: reason.to_string(),
        };
        let (path, tag) = match (name.rfind(':'), name.rfind('/')) {
            (Some(c), slash) if slash.is_none_or(|s| c > s) => (&name[..c], &name[c + 1..]),
            _ => (name, DEFAULT_TAG),
        };
        let parts: Vec<&str> = path.split('/').collect();
        let (host, namespace, model) = match parts.as_slice() {
            [m] => (DEFAULT_HOST, DEFAULT_NAMESPACE, *m),
            [ns, m] => (DEFAULT_HOST, *ns, *m),
            [h, ns, m] => (*h, *ns, *m),
            _ => return Err(err("expected [host/][namespace/]model[:tag]")),
        };
        check_part(host, 350, true).map_err(|r| err(&format!("host {r}")))?;
        check_part(namespace, 80, false).map_err(|r| err(&format!("namespace {r}")))?;
        if namespace.contains('.') {
            return Err(err("namespace may not contain `.`"));
        }
        check_part(model, 80, false).map_err(|r| err(&format!("model {r}")))?;
        check_part(tag, 80, false).map_err(|r| err(&format!("tag {r}")))?;
        Ok(ModelName {
            host: host.into(),
            namespace: namespace.into(),
            model: model.into(),
            tag: tag.into(),
        })
    }

    /// `manifests/<host>/<namespace>/<model>/<tag>`, relative to the store root.
    pub fn manifest_path(&self) -> PathBuf {
        [
            "manifests",
            &self.host,
            &self.namespace,
            &self.model,
            &self.tag,
        ]
        .iter()
        .collect()
    }

    /// The shortest spelling that parses back to this name (`z-image`, `x/z-image:tiny`).
    pub fn short(&self) -> String {
        let mut s = String::new();
        if self.host != DEFAULT_HOST {
            s.push_str(&format!("{}/{}/", self.host, self.namespace));
        } else if self.namespace != DEFAULT_NAMESPACE {
            s.push_str(&format!("{}/", self.namespace));
        }
        s.push_str(&self.model);
        if self.tag != DEFAULT_TAG {
            s.push_str(&format!(":{}", self.tag));
        }
        s
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}:{}",
            self.host, self.namespace, self.model, self.tag
        )
    }
}

/// A name as an error may print it: control characters escaped, and cut at 80 characters, so a
/// hostile name cannot break the one-line message or flood the terminal.
fn printable(name: &str) -> String {
    let escaped: String = name.escape_debug().collect();
    match escaped.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &escaped[..at]),
        None => escaped,
    }
}

fn check_part(part: &str, max: usize, is_host: bool) -> Result<(), String> {
    if part.is_empty() || part.len() > max {
        return Err(format!("must be 1 to {max} characters"));
    }
    let first = part.chars().next().expect("non-empty");
    if !(first.is_ascii_alphanumeric() || first == '_') {
        return Err(format!(
            "`{}` must start with a letter, digit or `_`",
            printable(part)
        ));
    }
    let ok = |c: char| {
        c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') || (is_host && c == ':')
    };
    if let Some(c) = part.chars().find(|&c| !ok(c)) {
        return Err(format!(
            "`{}` contains `{}`",
            printable(part),
            c.escape_debug()
        ));
    }
    if part.contains("..") {
        return Err(format!("`{}` contains `..`", printable(part)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_parts() {
        let n = ModelName::parse("z-image").unwrap();
        assert_eq!(n.to_string(), "registry.ollama.ai/library/z-image:latest");
        assert_eq!(
            n.manifest_path(),
            PathBuf::from("manifests/registry.ollama.ai/library/z-image/latest")
        );
        assert_eq!(ModelName::parse("x/z-image-turbo").unwrap().namespace, "x");
        let n = ModelName::parse("localhost:5000/me/tiny:v1").unwrap();
        assert_eq!((n.host.as_str(), n.tag.as_str()), ("localhost:5000", "v1"));
        assert_eq!(n.short(), "localhost:5000/me/tiny:v1");
        assert_eq!(
            ModelName::parse("me/tiny:fp8").unwrap().short(),
            "me/tiny:fp8"
        );
    }

    #[test]
    fn nothing_reaches_outside_the_store() {
        for bad in [
            "..", "../etc", "a/../b", "a/b/c/d", "", "x:..", ".hidden", "a b", "ns.x/m", "/abs",
            "m:",
        ] {
            assert!(ModelName::parse(bad).is_err(), "{bad} should be rejected");
        }
    }
}
