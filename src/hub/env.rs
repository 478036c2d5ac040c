//! Where the Hub is, where its cache lies and which token to send, read from the variables
//! huggingface_hub reads, so that both see one cache and one login.

use std::ffi::OsString;
use std::path::PathBuf;

/// The public Hub, when `HF_ENDPOINT` names no other.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The largest token file read (a token is under a hundred bytes).
const TOKEN_FILE_LIMIT: u64 = 4 << 10;

#[derive(Debug, Clone)]
pub struct HubEnv {
    /// `HF_ENDPOINT`, without a trailing `/`.
    pub endpoint: String,
    /// `HF_HUB_CACHE`, else `$HF_HOME/hub`.
    pub cache: PathBuf,
    /// `HF_TOKEN`, else the file `hf auth login` writes (`HF_TOKEN_PATH`, else
    /// `$HF_HOME/token`).
    pub token: Option<String>,
}

impl HubEnv {
    /// From the process's environment.
    pub fn from_env() -> HubEnv {
        HubEnv::from_vars(|k| std::env::var_os(k))
    }

    /// From `var` (a stand-in for the environment): `HF_HOME` defaults to
    /// `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> HubEnv {
        let set = |k: &str| var(k).filter(|v| !v.is_empty());
        let home = set("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            set("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| set("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"))
                .join("huggingface")
        });
        let cache = set("HF_HUB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join("hub"));
        let endpoint = set("HF_ENDPOINT")
            .map(|e| e.to_string_lossy().trim_end_matches('/').to_string())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token_file = set("HF_TOKEN_PATH")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join("token"));
        let token = set("HF_TOKEN")
            .map(|t| t.to_string_lossy().into_owned())
            .or_else(|| {
                crate::files::read_text_bounded(&token_file, TOKEN_FILE_LIMIT, "token file").ok()
            })
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        HubEnv {
            endpoint,
            cache,
            token,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> HubEnv {
        let vars: Vec<(String, OsString)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        HubEnv::from_vars(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn the_cache_and_endpoint_are_where_huggingface_hub_looks() {
        let e = env(&[("HOME", "/h")]);
        assert_eq!(e.cache, PathBuf::from("/h/.cache/huggingface/hub"));
        assert_eq!(e.endpoint, DEFAULT_ENDPOINT);
        let e = env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")]);
        assert_eq!(e.cache, PathBuf::from("/x/huggingface/hub"));
        let e = env(&[("HF_HOME", "/hf"), ("HF_ENDPOINT", "http://127.0.0.1:9/")]);
        assert_eq!(e.cache, PathBuf::from("/hf/hub"));
        assert_eq!(e.endpoint, "http://127.0.0.1:9");
        let e = env(&[("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/c")]);
        assert_eq!(e.cache, PathBuf::from("/c"));
    }

    #[test]
    fn the_token_comes_from_hf_token_else_the_login_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "hf_file\n").unwrap();
        let home = dir.path().to_str().unwrap();
        let e = env(&[("HF_HOME", home)]);
        assert_eq!(e.token.as_deref(), Some("hf_file"));
        let e = env(&[("HF_HOME", home), ("HF_TOKEN", "hf_env")]);
        assert_eq!(e.token.as_deref(), Some("hf_env"));
        let e = env(&[("HF_HOME", "/nonexistent")]);
        assert_eq!(e.token, None);
    }
}
