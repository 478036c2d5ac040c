//! The hand-written Rust declarations of the shim's C ABI (`src/mlx/ffi.rs`) against the header
//! they mirror (`mlx-sys-shim/shim.h`): the same functions, each with the same parameter types in
//! the same order and the same return type. A mismatch compiles and links on both sides and only
//! shows as corrupted arguments at run time, so it is caught here instead.
//!
//! Both files are read as text. The header's helper macros (`MLXS_UNARY(name)` …) and ffi.rs's
//! declaration macros (`unary!` …) are expanded from their own definitions, so a change to a
//! macro's signature is checked like any other.

use std::collections::BTreeMap;
use std::fmt;

/// A type in Rust's spelling, which both sides are translated into before comparing.
#[derive(Clone, PartialEq, Eq, Debug)]
enum Ty {
    Unit,
    Named(String),
    Ptr { mutable: bool, to: Box<Ty> },
    Fn { params: Vec<Ty>, ret: Box<Ty> },
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Unit => write!(f, "()"),
            Ty::Named(n) => write!(f, "{n}"),
            Ty::Ptr { mutable, to } => {
                write!(f, "*{} {to}", if *mutable { "mut" } else { "const" })
            }
            Ty::Fn { params, ret } => {
                let params: Vec<String> = params.iter().map(Ty::to_string).collect();
                write!(f, "extern \"C\" fn({})", params.join(", "))?;
                if **ret != Ty::Unit {
                    write!(f, " -> {ret}")?;
                }
                Ok(())
            }
        }
    }
}

/// One declared function: its parameter and return types, each with the text it was read from.
#[derive(Debug)]
struct Signature {
    params: Vec<(Result<Ty, String>, String)>,
    ret: (Result<Ty, String>, String),
}

type Declarations = BTreeMap<String, Signature>;

// ---------------------------------------------------------------------------------------------
// Shared text helpers

fn strip_comments(src: &str, block: bool) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while !rest.is_empty() {
        if block && rest.starts_with("/*") {
            let end = rest.find("*/").map_or(rest.len(), |i| i + 2);
            out.push(' ');
            rest = &rest[end..];
        } else if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            rest = &rest[end..];
        } else if rest.starts_with('"') {
            // Strings are copied whole, so that a `//` inside one is not taken for a comment.
            let end = rest[1..].find('"').map_or(rest.len(), |i| i + 2);
            out.push_str(&rest[..end]);
            rest = &rest[end..];
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Splits `s` at top-level commas (not inside (), [], {} or <>).
fn split_top(s: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    let mut prev = ' ';
    for c in s.chars() {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            // `->` is an arrow, not a closing angle bracket.
            '>' if prev != '-' => depth -= 1,
            _ => {}
        }
        if c == sep && depth == 0 {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
        prev = c;
    }
    parts.push(cur);
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The text between the bracket at `open` and its match, and the index just past the match.
fn balanced(s: &str, open: usize) -> Option<(&str, usize)> {
    let bytes = s.as_bytes();
    let (o, c) = match bytes[open] {
        b'(' => (b'(', b')'),
        b'{' => (b'{', b'}'),
        b'[' => (b'[', b']'),
        _ => return None,
    };
    let mut depth = 0;
    for (i, &b) in bytes.iter().enumerate().skip(open) {
        if b == o {
            depth += 1;
        } else if b == c {
            depth -= 1;
            if depth == 0 {
                return Some((&s[open + 1..i], i + 1));
            }
        }
    }
    None
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Replaces whole-word occurrences of `word` in `s`.
fn replace_word(s: &str, word: &str, with: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find(word) {
        let before_ok = !rest[..i].ends_with(is_ident_char);
        let after_ok = !rest[i + word.len()..].starts_with(is_ident_char);
        out.push_str(&rest[..i]);
        out.push_str(if before_ok && after_ok { with } else { word });
        rest = &rest[i + word.len()..];
    }
    out.push_str(rest);
    out
}

fn tokens(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if is_ident_char(c) {
            let start = i;
            // Paths (`std::os::raw::c_int`) are one token; a lone `:` ends the identifier.
            while i < chars.len()
                && (is_ident_char(chars[i]) || (chars[i] == ':' && chars.get(i + 1) == Some(&':')))
            {
                i += if chars[i] == ':' { 2 } else { 1 };
            }
            out.push(chars[start..i].iter().collect());
        } else if c == '-' && chars.get(i + 1) == Some(&'>') {
            out.push("->".into());
            i += 2;
        } else if c == '"' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += 1;
            }
            i += 1;
            out.push(chars[start..i.min(chars.len())].iter().collect());
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The C header

/// `#define NAME(params) body` macros, then the header's text with every use expanded and
/// every preprocessor line removed.
fn expand_c_macros(src: &str) -> String {
    let src = strip_comments(src, true).replace("\\\n", " ");
    let mut macros = Vec::new();
    let mut body = String::new();
    for line in src.lines() {
        let trimmed = line.trim_start();
        if let Some(def) = trimmed.strip_prefix('#') {
            let def = def.trim_start();
            if let Some(def) = def.strip_prefix("define") {
                let def = def.trim_start();
                if let Some(open) = def.find('(') {
                    let name = &def[..open];
                    if name.chars().all(is_ident_char) {
                        let (params, end) = balanced(def, open).expect("closed macro parameters");
                        let params: Vec<String> = split_top(params, ',');
                        macros.push((name.to_string(), params, def[end..].trim().to_string()));
                    }
                }
            }
            continue;
        }
        body.push_str(line);
        body.push('\n');
    }
    for (name, params, template) in &macros {
        let mut out = String::new();
        let mut rest = body.as_str();
        while let Some(i) = rest.find(name.as_str()) {
            let after = &rest[i + name.len()..];
            let is_call =
                !rest[..i].ends_with(is_ident_char) && after.trim_start().starts_with('(');
            if !is_call {
                out.push_str(&rest[..i + name.len()]);
                rest = after;
                continue;
            }
            let open = i + name.len() + (after.len() - after.trim_start().len());
            let (args, end) = balanced(rest, open).expect("closed macro arguments");
            let args = split_top(args, ',');
            let mut expansion = template.clone();
            for (p, a) in params.iter().zip(&args) {
                expansion = replace_word(&expansion, p, a);
            }
            out.push_str(&rest[..i]);
            out.push_str(&expansion.replace(" ## ", "").replace("##", ""));
            out.push('\n');
            rest = &rest[end..];
        }
        out.push_str(rest);
        body = out;
    }
    body
}

fn c_named(words: &[&str]) -> Result<Ty, String> {
    let name = match words.join(" ").as_str() {
        "void" => return Ok(Ty::Unit),
        "int" | "signed" | "signed int" => "c_int",
        "unsigned" | "unsigned int" => "c_uint",
        "long" => "c_long",
        "unsigned long" => "c_ulong",
        "char" => "c_char",
        "float" => "f32",
        "double" => "f64",
        "bool" | "_Bool" => "bool",
        "size_t" => "usize",
        "int8_t" => "i8",
        "int16_t" => "i16",
        "int32_t" => "i32",
        "int64_t" => "i64",
        "uint8_t" => "u8",
        "uint16_t" => "u16",
        "uint32_t" => "u32",
        "uint64_t" => "u64",
        "mlxs_array" => "mlxs_array",
        other => {
            return Err(format!(
                "no Rust counterpart known for the C type `{other}`"
            ))
        }
    };
    Ok(Ty::Named(name.into()))
}

const C_TYPE_WORDS: &[&str] = &["signed", "unsigned", "int", "long", "short", "char", "void"];

/// A C parameter or return type (`const mlxs_array* const* xs`, `void (*deleter)(void* ctx)`),
/// with the parameter's name, if any, dropped.
fn c_type(decl: &str) -> Result<Ty, String> {
    let toks = tokens(decl);
    // A function pointer: `ret (*name)(params)`.
    if let Some(star) = toks.windows(2).position(|w| w[0] == "(" && w[1] == "*") {
        let ret = c_type(&toks[..star].join(" "))?;
        let rest = decl.trim();
        let params_open = rest.rfind(')').and_then(|close| {
            let mut depth = 0;
            for (i, c) in rest[..=close].char_indices().rev() {
                match c {
                    ')' => depth += 1,
                    '(' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i);
                        }
                    }
                    _ => {}
                }
            }
            None
        });
        let open = params_open.ok_or_else(|| format!("unreadable function pointer `{decl}`"))?;
        let (params, _) = balanced(rest, open).unwrap();
        return Ok(Ty::Fn {
            params: c_params(params)?,
            ret: Box::new(ret),
        });
    }
    let mut toks: Vec<&str> = toks.iter().map(String::as_str).collect();
    // A trailing identifier after a complete type is the parameter's name.
    if let Some(last) = toks.last() {
        let has_type_before = toks[..toks.len() - 1]
            .iter()
            .any(|t| *t == "*" || (*t != "const" && t.chars().all(is_ident_char)));
        if has_type_before && last.chars().all(is_ident_char) && !C_TYPE_WORDS.contains(last) {
            toks.pop();
        }
    }
    let first_star = toks.iter().position(|t| *t == "*").unwrap_or(toks.len());
    let base_words: Vec<&str> = toks[..first_star]
        .iter()
        .copied()
        .filter(|t| *t != "const")
        .collect();
    let mut ty = c_named(&base_words)?;
    let mut ty_const = toks[..first_star].contains(&"const");
    if ty == Ty::Unit && first_star < toks.len() {
        ty = Ty::Named("c_void".into());
    }
    let mut i = first_star;
    while i < toks.len() {
        if toks[i] != "*" {
            return Err(format!("unreadable C type `{decl}`"));
        }
        ty = Ty::Ptr {
            mutable: !ty_const,
            to: Box::new(ty),
        };
        ty_const = toks.get(i + 1) == Some(&"const");
        i += if ty_const { 2 } else { 1 };
    }
    Ok(ty)
}

fn c_params(list: &str) -> Result<Vec<Ty>, String> {
    if list.trim() == "void" || list.trim().is_empty() {
        return Ok(Vec::new());
    }
    split_top(list, ',').iter().map(|p| c_type(p)).collect()
}

/// Every `mlxs_*` function declared in the header.
fn c_declarations(header: &str) -> Declarations {
    let text = expand_c_macros(header).replace("extern \"C\" {", " ");
    let mut decls = Declarations::new();
    for stmt in text.split(';') {
        let stmt = stmt.trim().trim_start_matches('}').trim();
        if stmt.starts_with("typedef") {
            continue;
        }
        // The function's name is the identifier just before its parameter list.
        let Some(open) = stmt.find('(') else {
            continue;
        };
        let before = stmt[..open].trim_end();
        let name_at = before
            .rfind(|c: char| !is_ident_char(c))
            .map_or(0, |i| i + 1);
        let name = &before[name_at..];
        if !name.starts_with("mlxs_") {
            continue;
        }
        let Some((params, _)) = balanced(stmt, open) else {
            continue;
        };
        let ret_text = stmt[..name_at].trim().to_string();
        let params = if params.trim() == "void" {
            Vec::new()
        } else {
            split_top(params, ',')
                .into_iter()
                .map(|p| (c_type(&p), p))
                .collect()
        };
        decls.insert(
            name.to_string(),
            Signature {
                params,
                ret: (c_type(&ret_text), ret_text),
            },
        );
    }
    decls
}

// ---------------------------------------------------------------------------------------------
// The Rust declarations

/// `pub type NAME = TYPE;` aliases (one a line), by name.
fn rust_aliases(src: &str) -> BTreeMap<String, String> {
    let mut aliases = BTreeMap::new();
    for line in src.lines() {
        let line = line.trim();
        let Some(rest) = line
            .strip_prefix("pub type ")
            .or_else(|| line.strip_prefix("type "))
        else {
            continue;
        };
        let rest = rest.split(';').next().unwrap_or(rest);
        if let Some((name, ty)) = rest.split_once('=') {
            aliases.insert(name.trim().to_string(), ty.trim().to_string());
        }
    }
    aliases
}

fn rust_type(text: &str, aliases: &BTreeMap<String, String>) -> Result<Ty, String> {
    let toks = tokens(text);
    let mut pos = 0;
    let ty = parse_rust_type(&toks, &mut pos, aliases)?;
    if pos != toks.len() {
        return Err(format!("unreadable Rust type `{text}`"));
    }
    Ok(ty)
}

fn parse_rust_type(
    toks: &[String],
    pos: &mut usize,
    aliases: &BTreeMap<String, String>,
) -> Result<Ty, String> {
    let tok = toks.get(*pos).ok_or("a type ends early")?.as_str();
    *pos += 1;
    match tok {
        "*" => {
            let mutable = match toks.get(*pos).map(String::as_str) {
                Some("mut") => true,
                Some("const") => false,
                _ => return Err("a raw pointer without `const` or `mut`".into()),
            };
            *pos += 1;
            let to = parse_rust_type(toks, pos, aliases)?;
            Ok(Ty::Ptr {
                mutable,
                to: Box::new(to),
            })
        }
        "(" if toks.get(*pos).map(String::as_str) == Some(")") => {
            *pos += 1;
            Ok(Ty::Unit)
        }
        "unsafe" | "extern" | "fn" => {
            while toks.get(*pos - 1).map(String::as_str) != Some("fn") {
                *pos += 1;
                if *pos > toks.len() {
                    return Err("a function pointer without `fn`".into());
                }
            }
            if toks.get(*pos).map(String::as_str) != Some("(") {
                return Err("a function pointer without parameters".into());
            }
            *pos += 1;
            let mut params = Vec::new();
            while toks.get(*pos).map(String::as_str) != Some(")") {
                // An optional `name:` before each parameter's type.
                if toks.get(*pos + 1).map(String::as_str) == Some(":") {
                    *pos += 2;
                }
                params.push(parse_rust_type(toks, pos, aliases)?);
                if toks.get(*pos).map(String::as_str) == Some(",") {
                    *pos += 1;
                }
                if *pos >= toks.len() {
                    return Err("an unclosed function pointer".into());
                }
            }
            *pos += 1;
            let ret = if toks.get(*pos).map(String::as_str) == Some("->") {
                *pos += 1;
                parse_rust_type(toks, pos, aliases)?
            } else {
                Ty::Unit
            };
            Ok(Ty::Fn {
                params,
                ret: Box::new(ret),
            })
        }
        path if path.chars().all(|c| is_ident_char(c) || c == ':') => {
            let name = path.rsplit("::").next().unwrap_or(path);
            match aliases.get(name) {
                Some(target) => rust_type(target, aliases),
                None => Ok(Ty::Named(name.to_string())),
            }
        }
        other => Err(format!("unexpected `{other}` in a Rust type")),
    }
}

/// `macro_rules!` declaration macros (one `$name:ident` list, a `pub fn $name(…)` template)
/// expanded at each use, so that their declarations read like the written-out ones.
fn expand_rust_macros(src: &str) -> String {
    let mut templates = Vec::new();
    let mut text = src.to_string();
    while let Some(at) = text.find("macro_rules!") {
        let open = at + text[at..].find('{').expect("macro body");
        let (def, end) = balanced(&text, open).expect("closed macro");
        let name = text[at + "macro_rules!".len()..open].trim().to_string();
        if name == "shim_api" {
            // The declaring macro itself: its uses are read as `extern "C"` blocks.
            text.replace_range(at..end, "");
            continue;
        }
        let var = def
            .find(":ident")
            .map(|i| {
                let start = def[..i].rfind('$').expect("metavariable") + 1;
                def[start..i].to_string()
            })
            .expect("an ident list");
        let fn_at = def.find("pub fn ").expect("a function template");
        let fn_end = fn_at + def[fn_at..].find(';').expect("a declaration") + 1;
        templates.push((name, var, def[fn_at..fn_end].to_string()));
        text.replace_range(at..end, "");
    }
    let mut expanded = String::new();
    for (name, var, template) in &templates {
        let call = format!("{name}!");
        while let Some(at) = text.find(&call) {
            let open = at
                + call.len()
                + (text[at + call.len()..].len() - text[at + call.len()..].trim_start().len());
            let (args, end) = balanced(&text, open).expect("closed macro call");
            for arg in split_top(args, ',') {
                expanded.push_str(&template.replace(&format!("${var}"), &arg));
                expanded.push('\n');
            }
            let end = if text[end..].trim_start().starts_with(';') {
                end + text[end..].find(';').unwrap() + 1
            } else {
                end
            };
            text.replace_range(at..end, "");
        }
    }
    format!("extern \"C\" {{\n{expanded}}}\n{text}")
}

/// Every function declared in an `extern "C"` block of ffi.rs, or in a `shim_api!` list (which
/// becomes one).
fn rust_declarations(src: &str) -> Declarations {
    let src = strip_comments(src, true);
    let aliases = rust_aliases(&src);
    let text = expand_rust_macros(&src).replace("shim_api!", "extern \"C\"");
    let mut decls = Declarations::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("extern \"C\"") {
        let after = &rest[at + "extern \"C\"".len()..];
        if !after.trim_start().starts_with('{') {
            rest = after;
            continue;
        }
        let open = after.find('{').unwrap();
        let (block, end) = balanced(after, open).expect("closed extern block");
        for stmt in block.split(';') {
            let Some(fn_at) = stmt.find("fn ") else {
                continue;
            };
            let sig = &stmt[fn_at + 3..];
            let Some(open) = sig.find('(') else {
                continue;
            };
            let name = sig[..open].trim().to_string();
            let (params, end) = balanced(sig, open).expect("closed parameters");
            let ret_text = sig[end..]
                .trim()
                .strip_prefix("->")
                .map_or("()".to_string(), |r| r.trim().to_string());
            let params = split_top(params, ',')
                .into_iter()
                .map(|p| {
                    let ty = p.split_once(':').map_or(p.as_str(), |(_, t)| t).trim();
                    (rust_type(ty, &aliases), p.clone())
                })
                .collect();
            decls.insert(
                name,
                Signature {
                    params,
                    ret: (rust_type(&ret_text, &aliases), ret_text),
                },
            );
        }
        rest = &after[end..];
    }
    decls
}

// ---------------------------------------------------------------------------------------------
// The comparison

fn describe(ty: &Result<Ty, String>, text: &str) -> String {
    match ty {
        Ok(t) => format!("`{text}` (= {t})"),
        Err(e) => format!("`{text}` ({e})"),
    }
}

fn types_match(c: &Result<Ty, String>, r: &Result<Ty, String>) -> bool {
    matches!((c, r), (Ok(c), Ok(r)) if c == r)
}

/// Every difference between the two sides, one line each.
fn mismatches(c: &Declarations, rust: &Declarations) -> Vec<String> {
    let mut out = Vec::new();
    for name in c.keys().filter(|n| !rust.contains_key(*n)) {
        out.push(format!("{name}: declared in shim.h, missing from ffi.rs"));
    }
    for name in rust.keys().filter(|n| !c.contains_key(*n)) {
        out.push(format!("{name}: declared in ffi.rs, missing from shim.h"));
    }
    for (name, cs) in c {
        let Some(rs) = rust.get(name) else { continue };
        if cs.params.len() != rs.params.len() {
            out.push(format!(
                "{name}: {} parameters in shim.h, {} in ffi.rs",
                cs.params.len(),
                rs.params.len()
            ));
        }
        for (i, ((ct, ctext), (rt, rtext))) in cs.params.iter().zip(&rs.params).enumerate() {
            if !types_match(ct, rt) {
                out.push(format!(
                    "{name}: parameter {i}: C {} vs Rust {}",
                    describe(ct, ctext),
                    describe(rt, rtext)
                ));
            }
        }
        if !types_match(&cs.ret.0, &rs.ret.0) {
            out.push(format!(
                "{name}: return type: C {} vs Rust {}",
                describe(&cs.ret.0, &cs.ret.1),
                describe(&rs.ret.0, &rs.ret.1)
            ));
        }
    }
    out
}

fn read(path: &str) -> String {
    let full = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("cannot read {full}: {e}"))
}

fn header() -> String {
    read("mlx-sys-shim/shim.h")
}

fn bindings() -> String {
    read("src/mlx/ffi.rs")
}

#[test]
fn ffi_declarations_match_the_shim_header() {
    let c = c_declarations(&header());
    let rust = rust_declarations(&bindings());
    let problems = mismatches(&c, &rust);
    assert!(
        problems.is_empty(),
        "src/mlx/ffi.rs and mlx-sys-shim/shim.h disagree in {} place(s):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

#[test]
fn both_parsers_expand_their_declaration_macros() {
    let c = c_declarations(&header());
    let rust = rust_declarations(&bindings());
    // One from each macro family of each file, and one written out.
    for name in ["mlxs_silu", "mlxs_matmul", "mlxs_argmax", "mlxs_fast_rope"] {
        assert!(c.contains_key(name), "shim.h parse lacks {name}");
        assert!(rust.contains_key(name), "ffi.rs parse lacks {name}");
    }
    assert_eq!(c["mlxs_sum"].params.len(), 5);
    assert_eq!(rust["mlxs_sum"].params.len(), 5);
    assert!(c.len() > 90, "only {} functions read from shim.h", c.len());
}

#[test]
fn c_types_translate_with_their_constness() {
    let t = |s: &str| c_type(s).unwrap().to_string();
    assert_eq!(t("mlxs_array** out"), "*mut *mut mlxs_array");
    assert_eq!(t("const mlxs_array* a"), "*const mlxs_array");
    assert_eq!(t("mlxs_array* const* xs"), "*const *mut mlxs_array");
    assert_eq!(t("const mlxs_array* const* xs"), "*const *const mlxs_array");
    assert_eq!(t("const char* const* names"), "*const *const c_char");
    assert_eq!(t("char*** names"), "*mut *mut *mut c_char");
    assert_eq!(t("const int32_t*"), "*const i32");
    assert_eq!(t("int32_t* dst"), "*mut i32");
    assert_eq!(t("size_t n"), "usize");
    assert_eq!(t("uint64_t seed"), "u64");
    assert_eq!(t("int"), "c_int");
    assert_eq!(t("const void* data"), "*const c_void");
    assert_eq!(t("void"), "()");
    assert_eq!(
        t("void (*deleter)(void* ctx)"),
        "extern \"C\" fn(*mut c_void)"
    );
}

#[test]
fn a_changed_parameter_type_in_the_header_is_reported_with_both_types() {
    let changed = header().replacen(
        "int mlxs_reshape(mlxs_array** out, const mlxs_array* a, const int32_t* shape, size_t ndim);",
        "int mlxs_reshape(mlxs_array** out, const mlxs_array* a, const int32_t* shape, int ndim);",
        1,
    );
    assert!(
        changed != header(),
        "shim.h no longer declares mlxs_reshape as this test expects"
    );
    let problems = mismatches(&c_declarations(&changed), &rust_declarations(&bindings()));
    assert_eq!(
        problems,
        ["mlxs_reshape: parameter 3: C `int ndim` (= c_int) vs Rust `ndim: usize` (= usize)"]
    );
}

#[test]
fn a_missing_declaration_and_a_changed_macro_are_reported_per_function() {
    let header = header()
        .replace("MLXS_UNARY(silu)", "")
        .replace(
            "#define MLXS_REDUCE(name) \\\n  int mlxs_##name(mlxs_array** out, const mlxs_array* a, const int32_t* axes, size_t n, int keepdims);",
            "#define MLXS_REDUCE(name) \\\n  int mlxs_##name(mlxs_array** out, const mlxs_array* a, const int32_t* axes, size_t n);",
        );
    let problems = mismatches(&c_declarations(&header), &rust_declarations(&bindings()));
    assert!(
        problems.contains(&"mlxs_silu: declared in ffi.rs, missing from shim.h".to_string()),
        "{problems:#?}"
    );
    for name in [
        "mlxs_sum",
        "mlxs_mean",
        "mlxs_max",
        "mlxs_min",
        "mlxs_argmax",
    ] {
        assert!(
            problems.contains(&format!("{name}: 4 parameters in shim.h, 5 in ffi.rs")),
            "{problems:#?}"
        );
    }
}
