//! Component names (`transformer`, `text_encoder`, `vae`): the folder names of a diffusers
//! model and the first path segment of a stored layer. One rule for every command that takes
//! `--component`, since a name becomes part of a path.

/// The longest component name: diffusers' own are under 20 bytes.
pub const MAX_COMPONENT_LEN: usize = 64;

/// Checks a component name: non-empty, at most [`MAX_COMPONENT_LEN`] bytes, ASCII lowercase
/// letters, digits, `_` and `-`, starting with a letter. So a name can never be a path (`/`,
/// `..`), hidden (`.x`), or differ from another only by case on a case-insensitive disk.
pub fn validate_component(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("component name is empty; use e.g. `transformer`".into());
    }
    if name.len() > MAX_COMPONENT_LEN {
        return Err(format!(
            "component name is {} bytes, more than {MAX_COMPONENT_LEN}",
            name.len()
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(format!(
            "component name `{}` must start with a lowercase letter",
            name.escape_debug()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|&c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-'))
    {
        return Err(format!(
            "component name `{}` has `{}`; use lowercase letters, digits, `_` and `-`",
            name.escape_debug(),
            c.escape_debug()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pipeline_components_are_valid_names() {
        for c in crate::diffusers_dir::WEIGHT_COMPONENTS {
            validate_component(c).unwrap();
        }
        validate_component("model").unwrap();
        validate_component("text-encoder_2").unwrap();
    }

    #[test]
    fn names_that_could_be_paths_or_confusions_are_refused() {
        let long = "a".repeat(65);
        for bad in [
            "",
            "..",
            ".hidden",
            "a/b",
            "a\\b",
            "Transformer",
            "2vae",
            "_x",
            "vae\0",
            "vae\n",
            "трансформер",
            long.as_str(),
        ] {
            assert!(validate_component(bad).is_err(), "{bad:?}");
        }
        validate_component(&"a".repeat(64)).unwrap();
    }
}
