//! What the Hub says a repository holds at a revision, and which of those files a diffusers
//! pipeline needs.
//!
//! `GET {endpoint}/api/models/{owner}/{repo}/revision/{rev}?blobs=true` answers the commit the
//! revision names and every file with its size, its git blob id and, for a file kept in LFS,
//! its sha256. Everything in the answer is checked before it names a path or a cache entry.

use super::HubError;
use crate::diffusers_dir::CONFIG_FILES;
use crate::store::ModelName;

/// The hosts a model name may give for the Hub (`hf.co/OWNER/REPO`, as Ollama names them).
pub const HUB_HOSTS: [&str; 2] = ["hf.co", "huggingface.co"];

/// The revision a name without `:REVISION` means.
pub const DEFAULT_REVISION: &str = "main";

/// A repository at a revision, from `hf.co/OWNER/REPO[:REVISION]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubRepo {
    pub owner: String,
    pub repo: String,
    pub revision: String,
    /// The store's name for it: `hf.co/OWNER/REPO[:REVISION]`.
    pub store_name: String,
}

impl HubRepo {
    /// `None` when `name` names no Hub repository (an Ollama registry model, a path).
    pub fn parse(name: &str) -> Option<Result<HubRepo, HubError>> {
        let host = HUB_HOSTS
            .iter()
            .find(|h| name.strip_prefix(*h).is_some_and(|r| r.starts_with('/')))?;
        let parsed = ModelName::parse(&format!("hf.co{}", &name[host.len()..]));
        Some(match parsed {
            Err(e) => Err(HubError::Name(e)),
            Ok(n) => {
                let tagged = name
                    .rfind(':')
                    .is_some_and(|c| c > name.rfind('/').unwrap_or(0));
                let revision = if tagged {
                    n.tag.clone()
                } else {
                    DEFAULT_REVISION.into()
                };
                Ok(HubRepo {
                    owner: n.namespace.clone(),
                    repo: n.model.clone(),
                    revision,
                    store_name: match tagged {
                        true => format!("hf.co/{}/{}:{}", n.namespace, n.model, n.tag),
                        false => format!("hf.co/{}/{}", n.namespace, n.model),
                    },
                })
            }
        })
    }

    /// `OWNER/REPO`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.owner, self.repo)
    }
}

/// One file of the repository at the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubFile {
    /// Relative, `/`-separated, checked to stay inside the repository.
    pub path: String,
    pub size: u64,
    /// The cache's name for its bytes: the sha256 of an LFS file, else the git blob id.
    pub etag: String,
    /// The sha256 the Hub states (LFS files), checked on download.
    pub sha256: Option<String>,
}

/// The revision's commit and files.
#[derive(Debug, Clone)]
pub struct Listing {
    pub commit: String,
    pub files: Vec<HubFile>,
}

#[derive(serde::Deserialize)]
struct RawListing {
    sha: String,
    #[serde(default)]
    siblings: Vec<RawSibling>,
}

#[derive(serde::Deserialize)]
struct RawSibling {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<RawLfs>,
}

#[derive(serde::Deserialize)]
struct RawLfs {
    sha256: String,
    size: u64,
}

fn is_hex(s: &str, lens: &[usize]) -> bool {
    lens.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A repository path that cannot lead outside a snapshot folder.
fn safe_path(path: &str) -> bool {
    !path.is_empty()
        && !path.contains('\\')
        && path.len() <= 1024
        && path
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != ".." && !p.chars().any(char::is_control))
}

impl Listing {
    /// The Hub's answer, checked: a malformed one is refused with what is wrong.
    pub fn parse(body: &[u8]) -> Result<Listing, String> {
        let raw: RawListing = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        if !is_hex(&raw.sha, &[40, 64]) {
            return Err(format!(
                "the commit `{}` is no git hash",
                crate::registry::printable(&raw.sha, 80)
            ));
        }
        let mut files = Vec::new();
        for s in raw.siblings {
            let shown = crate::registry::printable(&s.rfilename, 200);
            if !safe_path(&s.rfilename) {
                return Err(format!(
                    "the file name `{shown}` is not a safe relative path"
                ));
            }
            let (size, etag, sha256) = match (s.lfs, s.blob_id, s.size) {
                (Some(lfs), _, _) if is_hex(&lfs.sha256, &[64]) => {
                    let sha = lfs.sha256.to_ascii_lowercase();
                    (lfs.size, sha.clone(), Some(sha))
                }
                (Some(_), _, _) => {
                    return Err(format!("`{shown}` has an LFS sha256 that is no sha256"))
                }
                (None, Some(id), Some(size)) if is_hex(&id, &[40, 64]) => {
                    (size, id.to_ascii_lowercase(), None)
                }
                _ => return Err(format!("`{shown}` comes without its size and blob id")),
            };
            files.push(HubFile {
                path: s.rfilename,
                size,
                etag,
                sha256,
            });
        }
        Ok(Listing {
            commit: raw.sha.to_ascii_lowercase(),
            files,
        })
    }

    pub fn file(&self, path: &str) -> Option<&HubFile> {
        self.files.iter().find(|f| f.path == path)
    }
}

/// The components `model_index.json` lists: its keys whose value is `[library, class]`.
pub fn components(model_index: &[u8]) -> Result<Vec<String>, String> {
    let json: serde_json::Value = serde_json::from_slice(model_index).map_err(|e| e.to_string())?;
    let map = json.as_object().ok_or("it is not a JSON object")?;
    Ok(map
        .iter()
        .filter(|(k, v)| {
            !k.starts_with('_')
                && safe_path(k)
                && !k.contains('/')
                && v.as_array()
                    .is_some_and(|a| a.len() == 2 && a[1].is_string())
        })
        .map(|(k, _)| k.clone())
        .collect())
}

/// The files a diffusers pipeline of `components` loads: the configs zimage reads, and each
/// component's safetensors weights and shard index, in no other format and no variant
/// (`*.fp16.safetensors` and the like are left on the Hub).
pub fn pipeline_files<'a>(listing: &'a Listing, components: &[String]) -> Vec<&'a HubFile> {
    let weights = |name: &str| {
        [".safetensors.index.json", ".safetensors"]
            .iter()
            .any(|ext| {
                name.strip_suffix(ext)
                    .is_some_and(|stem| !stem.contains('.'))
            })
    };
    listing
        .files
        .iter()
        .filter(|f| {
            if CONFIG_FILES.contains(&f.path.as_str()) {
                return true;
            }
            let Some((component, name)) = f.path.split_once('/') else {
                return false;
            };
            // A component's config and tokenizer files go by the names zimage reads.
            let config = CONFIG_FILES
                .iter()
                .any(|c| c.split_once('/').is_some_and(|(_, file)| file == name));
            components.iter().any(|c| c == component)
                && !name.contains('/')
                && (config || weights(name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> HubFile {
        HubFile {
            path: path.into(),
            size: 1,
            etag: "e".into(),
            sha256: None,
        }
    }

    #[test]
    fn names_give_the_repository_the_revision_and_the_stored_name() {
        let r = HubRepo::parse("hf.co/acme/Image-Model-Turbo")
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.id().as_str(), r.revision.as_str()),
            ("acme/Image-Model-Turbo", "main")
        );
        assert_eq!(r.store_name, "hf.co/acme/Image-Model-Turbo");
        let r = HubRepo::parse("huggingface.co/o/r:v2").unwrap().unwrap();
        assert_eq!(
            (r.revision.as_str(), r.store_name.as_str()),
            ("v2", "hf.co/o/r:v2")
        );
        assert!(HubRepo::parse("z-image").is_none());
        assert!(HubRepo::parse("hf.cox/a/b").is_none());
        assert!(HubRepo::parse("hf.co/../b").unwrap().is_err());
    }

    #[test]
    fn a_pipeline_takes_configs_tokenizer_and_weights_but_no_variant() {
        let taken = [
            "model_index.json",
            "scheduler/scheduler_config.json",
            "tokenizer/vocab.json",
            "tokenizer/merges.txt",
            "text_encoder/config.json",
            "text_encoder/model-00001-of-00002.safetensors",
            "text_encoder/model.safetensors.index.json",
            "transformer/diffusion_pytorch_model.safetensors",
            "vae/config.json",
        ];
        let left = [
            "README.md",
            "transformer/diffusion_pytorch_model.fp16.safetensors",
            "transformer/diffusion_pytorch_model.bin",
            "unlisted/config.json",
            "assets/a.png",
        ];
        // The listing mixes them, as the Hub's order is not the pipeline's.
        let mut files: Vec<&str> = taken.to_vec();
        for (i, extra) in left.iter().enumerate() {
            files.insert(1 + 2 * i, extra);
        }
        let listing = Listing {
            commit: "0".repeat(40),
            files: files.into_iter().map(file).collect(),
        };
        let comps: Vec<String> = [
            "scheduler",
            "tokenizer",
            "text_encoder",
            "transformer",
            "vae",
        ]
        .map(String::from)
        .to_vec();
        let got: Vec<&str> = pipeline_files(&listing, &comps)
            .iter()
            .map(|f| f.path.as_str())
            .collect();
        assert_eq!(got, taken);
    }

    #[test]
    fn a_listing_naming_paths_outside_the_repository_is_refused() {
        for bad in ["../x", "/etc/passwd", "a//b", "a/./b", "a\\b"] {
            let body = format!(
                r#"{{"sha": "{}", "siblings": [{{"rfilename": "{}", "size": 1, "blobId": "{}"}}]}}"#,
                "a".repeat(40),
                bad.replace('\\', "\\\\"),
                "b".repeat(40)
            );
            assert!(Listing::parse(body.as_bytes()).is_err(), "{bad}");
        }
    }
}
