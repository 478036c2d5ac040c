//! A model's own chat template, rendered as transformers renders it: Jinja with blocks trimmed
//! and left-stripped, loop controls, Python's string methods, `raise_exception`, and the
//! tokenizer's special tokens as variables. The prompt is one user message whose content is
//! the prompt as a string, followed by the generation prompt.
//!
//! The template is the processor's (`chat_template.jinja`, else `chat_template.json`), else the
//! tokenizer's (`tokenizer_config.json`'s `chat_template`); a model that ships none has none.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{Environment, ErrorKind, Value};
use std::collections::BTreeMap;

/// The name the template is kept under in its environment.
const NAME: &str = "chat";

/// A model's chat template, checked to render.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The tokenizer's special tokens (`eos_token`, …), which templates may name.
    specials: BTreeMap<String, String>,
    /// The file it came from, for errors.
    file: &'static str,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("file", &self.file)
            .finish()
    }
}

impl ChatTemplate {
    /// The template among a tokenizer folder's files (`read(name)`: `None` when absent), if
    /// the folder has one; an unreadable or unparsable one is an error naming its file.
    pub fn from_files(
        read: impl Fn(&str) -> Result<Option<Vec<u8>>, String>,
    ) -> Result<Option<ChatTemplate>, String> {
        let config = match read("tokenizer_config.json")? {
            Some(bytes) => Some(json("tokenizer_config.json", &bytes)?),
            None => None,
        };
        let found = if let Some(bytes) = read("chat_template.jinja")? {
            let text = String::from_utf8(bytes)
                .map_err(|e| format!("`chat_template.jinja` is not UTF-8: {e}"))?;
            Some(("chat_template.jinja", text))
        } else if let Some(bytes) = read("chat_template.json")? {
            let v = json("chat_template.json", &bytes)?;
            Some((
                "chat_template.json",
                template_field("chat_template.json", &v)?,
            ))
        } else {
            match config.as_ref().filter(|c| c.get("chat_template").is_some()) {
                Some(c) => Some((
                    "tokenizer_config.json",
                    template_field("tokenizer_config.json", c)?,
                )),
                None => None,
            }
        };
        let Some((file, source)) = found else {
            return Ok(None);
        };
        let template = ChatTemplate::new(file, source, specials(config.as_ref()))?;
        // A template that cannot render an empty prompt would fail every request: say so now.
        template.render_user("")?;
        Ok(Some(template))
    }

    /// `source` as a template read from `file`, with the tokenizer's special tokens.
    pub fn new(
        file: &'static str,
        source: String,
        specials: BTreeMap<String, String>,
    ) -> Result<ChatTemplate, String> {
        let mut env = Environment::new();
        // transformers' Jinja environment: blocks trimmed and left-stripped.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| format!("`{file}`: {e}"))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<Value, _> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned(NAME, source)
            .map_err(|e| format!("`{file}`: the chat template does not parse: {e:#}"))?;
        Ok(ChatTemplate {
            env,
            specials,
            file,
        })
    }

    /// The text of `prompt` as the one user message, with the generation prompt after it.
    pub fn render_user(&self, prompt: &str) -> Result<String, String> {
        let template = (self.env.get_template(NAME)).map_err(|e| e.to_string())?;
        let mut context: BTreeMap<String, serde_json::Value> = (self.specials.iter())
            .map(|(k, v)| (k.clone(), v.as_str().into()))
            .collect();
        let message = serde_json::json!({"role": "user", "content": prompt});
        context.insert("messages".into(), serde_json::json!([message]));
        context.insert("add_generation_prompt".into(), true.into());
        template
            .render(Value::from(Serde(context)))
            .map_err(|e| format!("`{}`: the chat template failed: {e:#}", self.file))
    }
}

fn json(file: &str, bytes: &[u8]) -> Result<serde_json::Value, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("`{file}` is not valid JSON: {e}"))
}

/// A `chat_template` field: a string, or a list of named templates of which the one named
/// `default` is used, as transformers does.
fn template_field(file: &str, v: &serde_json::Value) -> Result<String, String> {
    match v.get("chat_template") {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Array(named)) => (named.iter())
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_string)
            .ok_or_else(|| format!("`{file}`: field `chat_template` names no `default` template")),
        _ => Err(format!(
            "`{file}`: field `chat_template` is missing or not a string"
        )),
    }
}

/// The tokenizer's special tokens by the names templates use (`bos_token`, `eos_token`, …),
/// each a string or an added token's `content`.
fn specials(config: Option<&serde_json::Value>) -> BTreeMap<String, String> {
    let names = [
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "sep_token",
        "cls_token",
        "mask_token",
    ];
    let mut out = BTreeMap::new();
    for name in names {
        let token = config.and_then(|c| c.get(name)).and_then(|t| match t {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Object(o) => o
                .get("content")
                .and_then(|c| c.as_str())
                .map(str::to_string),
            _ => None,
        });
        if let Some(token) = token {
            out.insert(name.to_string(), token);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(source: &str) -> ChatTemplate {
        ChatTemplate::new("chat_template.jinja", source.into(), BTreeMap::new()).unwrap()
    }

    #[test]
    fn renders_a_qwen_style_template_as_transformers_does() {
        // Macros, namespaces, Python string methods and trimmed blocks, as Qwen's templates
        // use them.
        let source = r#"{%- macro text(content) %}
    {%- if content is string %}
        {{- content }}
    {%- else %}
        {%- for item in content %}{{- item.text }}{%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- set ns = namespace(last=0) %}
{%- for message in messages %}
    {%- if message.content is string and message.content.startswith('<tool_response>') %}
        {{- raise_exception('no tools') }}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\n' + text(message.content) | trim + '<|im_end|>\n' }}
    {%- set ns.last = loop.index %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;
        let t = template(source);
        assert_eq!(
            t.render_user("a fox").unwrap(),
            "<|im_start|>user\na fox<|im_end|>\n<|im_start|>assistant\n"
        );
        let refused = t.render_user("<tool_response> x").unwrap_err();
        assert!(refused.contains("no tools"), "{refused}");
    }

    #[test]
    fn the_processor_template_comes_before_the_tokenizers() {
        let files = |name: &str| -> Result<Option<Vec<u8>>, String> {
            Ok(match name {
                "chat_template.json" => Some(br#"{"chat_template": "P{{ messages[0].content }}"}"#.to_vec()),
                "tokenizer_config.json" => Some(
                    br#"{"chat_template": "T{{ messages[0].content }}", "eos_token": {"content": "<|e|>"}}"#.to_vec(),
                ),
                _ => None,
            })
        };
        let t = ChatTemplate::from_files(files).unwrap().unwrap();
        assert_eq!(t.render_user("x").unwrap(), "Px");
        assert_eq!(t.specials["eos_token"], "<|e|>");
        let none = ChatTemplate::from_files(|_| Ok(None)).unwrap();
        assert!(none.is_none());
        let broken = |name: &str| -> Result<Option<Vec<u8>>, String> {
            Ok((name == "chat_template.jinja").then(|| b"{% for %}".to_vec()))
        };
        let e = ChatTemplate::from_files(broken).unwrap_err();
        assert!(e.contains("`chat_template.jinja`"), "{e}");
    }
}
