//! Model names and blob digests: the two strings from a user or a manifest that become paths
//! inside the store.
//!
//! Beyond "no panic": an accepted name stays inside `manifests/` (five plain components) and
//! reads back the same from both its spellings; an accepted digest is 64 hex digits and names
//! a file directly in `blobs/`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::{Component, Path};
use zimage::store::{blob, ModelName};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(name) = ModelName::parse(text) {
        let path = name.manifest_path();
        assert!(
            path.components().all(|c| matches!(c, Component::Normal(_))),
            "`{text}` leaves the store: {path:?}"
        );
        assert_eq!(path.components().count(), 5, "`{text}`: {path:?}");
        for spelled in [name.short(), name.to_string()] {
            let back = ModelName::parse(&spelled)
                .unwrap_or_else(|e| panic!("`{text}` is spelled `{spelled}`, which fails: {e}"));
            assert_eq!(back, name, "`{text}` reads back differently as `{spelled}`");
        }
    }
    if let Ok(hex) = blob::digest_hex(text) {
        assert!(hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
        let root = Path::new("/store");
        let path = blob::blob_path(root, text).expect("a valid digest has a path");
        assert_eq!(path.parent(), Some(root.join("blobs").as_path()));
        assert_eq!(
            path.file_name().and_then(|n| n.to_str()),
            Some(format!("sha256-{}", hex.to_ascii_lowercase()).as_str())
        );
    }
});
