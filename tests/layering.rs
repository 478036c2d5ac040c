//! The crate's modules form layers that point down only: no top-level module of `src/`
//! reaches back to one that uses it, through any chain of `crate::` paths.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules its files name through `crate::`.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&src).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let top = first.trim_end_matches(".rs").to_string();
            if top == "lib" || top == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let uses = g.entry(top.clone()).or_default();
            for line in text.lines() {
                let code = line.split("//").next().unwrap();
                for target in crate_paths(code) {
                    if target != top {
                        uses.insert(target);
                    }
                }
            }
        }
    }
    g
}

/// The first segment after each `crate::` in `code`, including each member of a
/// `crate::{a, b::c}` group.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Members are split at the group's own commas, not those of nested groups.
            let (mut depth, mut start) = (0, 0);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.extend(ident(group[start..j].trim()));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.extend(ident(group[start..j].trim()));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.extend(ident(rest));
        }
    }
    out
}

fn ident(s: &str) -> Option<String> {
    let name: String = s
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty() && name != "self").then_some(name)
}

/// A path `from` → … → `to` in `g`, if one exists.
fn path(g: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> Option<Vec<String>> {
    let mut prev: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([from.to_string()]);
    while let Some(v) = queue.pop_front() {
        for w in g.get(&v).into_iter().flatten() {
            if prev.contains_key(w) || w == from {
                continue;
            }
            prev.insert(w.clone(), v.clone());
            if w == to {
                let mut chain = vec![to.to_string()];
                while let Some(p) = prev.get(chain.last().unwrap()) {
                    chain.push(p.clone());
                    if p == from {
                        break;
                    }
                }
                chain.reverse();
                return Some(chain);
            }
            queue.push_back(w.clone());
        }
    }
    None
}

#[test]
fn no_module_reaches_back_to_one_that_uses_it() {
    let g = graph();
    assert!(g.contains_key("pipeline") && g["pipeline"].contains("models"));
    let mut cycles = Vec::new();
    for (a, uses) in &g {
        for b in uses {
            if let Some(back) = path(&g, b, a) {
                cycles.push(format!("{a} → {}", back.join(" → ")));
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn group_imports_count_every_member() {
    assert_eq!(
        crate_paths("use crate::{mlx::{self, Array}, models::vae, store};"),
        vec!["mlx", "models", "store"]
    );
    assert_eq!(
        crate_paths("x = crate::files::read(crate::dtype::F32);"),
        vec!["files", "dtype"]
    );
}
