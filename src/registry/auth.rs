//! Credentials and the `WWW-Authenticate` challenges registries answer with.
//!
//! A registry that wants a login answers 401 with either `Basic realm="…"` (send the user and
//! password with every request) or `Bearer realm="…",service="…",scope="…"` (ask the realm for
//! a token, with the user and password if there are any, and send the token).

use super::RegistryError;
use std::path::Path;

/// A user and password for one registry.
#[derive(Clone)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Credentials {{ user: {:?}, password: <hidden> }}",
            self.user
        )
    }
}

/// The largest credentials file read: a line per registry.
pub const MAX_CREDENTIALS_FILE: u64 = 1 << 20;

impl Credentials {
    /// `USER:PASSWORD`, as `--user` takes it.
    pub fn parse(text: &str, what: &str) -> Result<Credentials, RegistryError> {
        let (user, password) = text
            .split_once(':')
            .ok_or_else(|| RegistryError::Credentials {
                what: what.to_string(),
                problem: "expected `USER:PASSWORD` (a `:` between the user and the password)",
            })?;
        if user.is_empty() || user.chars().any(char::is_control) || password.contains(['\r', '\n'])
        {
            return Err(RegistryError::Credentials {
                what: what.to_string(),
                problem: "the user must be non-empty and neither may hold control characters",
            });
        }
        Ok(Credentials {
            user: user.to_string(),
            password: password.to_string(),
        })
    }

    /// The credentials for `host` in a file of lines `HOST USER:PASSWORD` (blank lines and
    /// lines starting with `#` skipped), or `None` when the file names no such host.
    pub fn from_file(path: &Path, host: &str) -> Result<Option<Credentials>, RegistryError> {
        let text = crate::files::read_text_bounded(path, MAX_CREDENTIALS_FILE, "credentials file")
            .map_err(RegistryError::CredentialsFile)?;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let what = format!("`{}` line {}", path.display(), i + 1);
            let (h, rest) =
                line.split_once(char::is_whitespace)
                    .ok_or_else(|| RegistryError::Credentials {
                        what: what.clone(),
                        problem: "expected `HOST USER:PASSWORD`",
                    })?;
            if h.eq_ignore_ascii_case(host) {
                return Credentials::parse(rest.trim(), &what).map(Some);
            }
        }
        Ok(None)
    }
}

/// One challenge of a `WWW-Authenticate` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// The challenge of a `WWW-Authenticate` value: `Basic …` or `Bearer k="v",…`.
pub fn parse_challenge(value: &str) -> Option<Challenge> {
    let value = value.trim();
    let (scheme, params) = value.split_once(' ').unwrap_or((value, ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let params = parse_params(params);
    let get = |k: &str| {
        params
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.clone())
    };
    Some(Challenge::Bearer {
        realm: get("realm")?,
        service: get("service"),
        scope: get("scope"),
    })
}

/// `k="v", k2=v2` pairs; quoted values may hold commas and `\"`.
fn parse_params(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ','))
            .collect::<String>()
            .trim()
            .to_string();
        if key.is_empty() || chars.next() != Some('=') {
            return out;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => value.extend(chars.next()),
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ','))
                .collect::<String>()
                .trim()
                .to_string();
        }
        out.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_with_quoted_commas_parse() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(parse_challenge("Basic realm=\"x\""), Some(Challenge::Basic));
        assert_eq!(parse_challenge("Bearer service=x"), None);
        assert_eq!(parse_challenge("Negotiate"), None);
    }

    #[test]
    fn user_and_password_split_at_the_first_colon() {
        let c = Credentials::parse("me:pa:ss", "--user").unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("me", "pa:ss"));
        assert!(Credentials::parse("nocolon", "--user").is_err());
        assert!(Credentials::parse(":pw", "--user").is_err());
        assert!(!format!("{c:?}").contains("pa:ss"));
    }
}
