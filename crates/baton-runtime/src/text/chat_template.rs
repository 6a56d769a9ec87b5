//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template` or
//! `tokenizer_config.json`'s `chat_template`) rendered with minijinja the way Hugging Face's
//! `apply_chat_template` does, and the checks that let a KV cache be extended turn by turn.
//!
//! # Prefix stability
//!
//! Reusing a KV cache across turns needs the ids already in the cache to be a prefix of the
//! ids of the longer conversation. After the model answered, the cache holds
//! `render(history, add_generation_prompt = true)` followed by the reply's ids up to and
//! including the end-of-turn token the model stopped on (`<|im_end|>` for ChatML). The next
//! turn's ids are those of `render(history + reply + user, add_generation_prompt = true)`.
//!
//! Finding for Qwen2.5 (checked on the real GGUF template, see `tests/chat_template.rs`):
//! the template is prefix-stable for plain system/user/assistant conversations. Every message
//! is `<|im_start|>{role}\n{content}<|im_end|>\n`, the generation prompt is exactly the opening
//! of the assistant message (`<|im_start|>assistant\n`), past assistant turns are not
//! rewritten, and the default system message it inserts when the conversation has none
//! (`You are Qwen, created by Alibaba Cloud. ...`) depends only on `messages[0]`, so it is the
//! same in every render. The ids after the cached `<|im_end|>` begin with `\n<|im_start|>`,
//! and `<|im_end|>` is a special token at which the tokenizer cuts the text, so the new ids
//! never merge with cached ones. The one tokenization caveat: a reply that *starts* with
//! whitespace/newlines re-tokenizes differently after `assistant\n` (the newline runs merge),
//! so a canonical re-render differs from what the model generated; [`ChatTemplate::incremental_ids`]
//! avoids that by working from the cached ids themselves. SmolLM2's ChatML template is stable
//! for the same reasons. Templates that rewrite history (Qwen3 drops past `<think>` blocks,
//! templates that print today's date) are not; [`ChatTemplate::prefix_stability`] reports
//! where.
//!
//! `strftime_now` is deliberately not provided: templates then fall back to their fixed date
//! string, which keeps renders reproducible and prefix-stable.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value as GgufValue};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

use super::error::TokenizerError;
use super::gguf_meta::{meta, meta_str, meta_u32};
use super::literal::{self, Segment};
pub use super::message::{ChatMessage, Role};
use super::tokenizer::{config_token, TextTokenizer};

const TEMPLATE_NAME: &str = "chat_template";

/// Errors from loading or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    #[error("the model has no chat template: {0}")]
    Missing(String),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot use {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("the chat template does not compile: {0}")]
    Syntax(String),
    #[error("the chat template failed to render: {0}")]
    Render(String),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(
        "the chat template is not prefix-stable for this conversation: {detail}; the ids in the cache cannot be extended, the conversation must be prefilled again"
    )]
    NotPrefixStable { detail: String },
}

/// Outcome of [`ChatTemplate::prefix_stability`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefixStability {
    /// Every turn's ids extend the previous turn's cached ids.
    Stable,
    /// The first turn where they do not.
    Unstable {
        /// Index (in the checked conversation) of the assistant message after which the
        /// cache could not be extended.
        message_index: usize,
        reason: String,
    },
}

/// A model's chat template, compiled.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("source_len", &self.source.len())
            .finish()
    }
}

impl ChatTemplate {
    /// Compile a template. `bos_token` / `eos_token` are the token strings the template sees
    /// as `bos_token` / `eos_token` (left undefined when `None`).
    pub fn new(
        source: impl Into<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        let source = source.into();
        let mut env = Environment::new();
        // Hugging Face renders with trim_blocks and lstrip_blocks, and loop controls on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", py_tojson);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        Ok(Self {
            env,
            source,
            bos_token,
            eos_token,
        })
    }

    /// A template whose `bos_token` / `eos_token` are those of `tok`.
    pub fn for_tokenizer(
        source: impl Into<String>,
        tok: &TextTokenizer,
    ) -> Result<Self, ChatTemplateError> {
        let bos = tok.bos_id().and_then(|id| tok.token_to_str(id));
        let eos = tok.eos_id().and_then(|id| tok.token_to_str(id));
        Self::new(source, bos, eos)
    }

    /// The template in GGUF `tokenizer.chat_template`, with BOS/EOS strings from the
    /// tokenizer metadata.
    pub fn from_gguf(content: &Content) -> Result<Self, ChatTemplateError> {
        let source = meta_str(content, "tokenizer.chat_template")?.ok_or_else(|| {
            ChatTemplateError::Missing("the GGUF metadata has no `tokenizer.chat_template`".into())
        })?;
        let token = |key: &str| -> Result<Option<String>, ChatTemplateError> {
            let Some(id) = meta_u32(content, key)? else {
                return Ok(None);
            };
            Ok(match meta(content, "tokenizer.ggml.tokens") {
                Some(GgufValue::Array(tokens)) => match tokens.get(id as usize) {
                    Some(GgufValue::String(s)) => Some(s.clone()),
                    _ => None,
                },
                _ => None,
            })
        };
        let bos = token("tokenizer.ggml.bos_token_id")?;
        let eos = token("tokenizer.ggml.eos_token_id")?;
        Self::new(source, bos, eos)
    }

    /// The `chat_template` of a `tokenizer_config.json` (a string, or a list of named
    /// templates of which `default` is taken), with its `bos_token` / `eos_token`.
    pub fn from_tokenizer_config(path: impl AsRef<Path>) -> Result<Self, ChatTemplateError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ChatTemplateError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let cfg: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ChatTemplateError::Config {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        let source = match cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => {
                let named = |name: &str| {
                    list.iter().find_map(|t| {
                        (t.get("name")?.as_str()? == name)
                            .then(|| t.get("template")?.as_str().map(str::to_string))
                            .flatten()
                    })
                };
                named("default").ok_or_else(|| ChatTemplateError::Config {
                    path: path.to_path_buf(),
                    message: "`chat_template` is a list without a `default` entry".into(),
                })?
            }
            _ => {
                return Err(ChatTemplateError::Missing(format!(
                    "{} has no `chat_template` string",
                    path.display()
                )))
            }
        };
        Self::new(
            source,
            config_token(&cfg, "bos_token"),
            config_token(&cfg, "eos_token"),
        )
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render `messages`; with `add_generation_prompt` the text ends with the opening of an
    /// assistant turn. `tools` and `documents` are `none`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
        ctx.insert("messages", Value::from_serialize(messages));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        ctx.insert("tools", Value::from(()));
        ctx.insert("documents", Value::from(()));
        if let Some(b) = &self.bos_token {
            ctx.insert("bos_token", Value::from(b.as_str()));
        }
        if let Some(e) = &self.eos_token {
            ctx.insert("eos_token", Value::from(e.as_str()));
        }
        tmpl.render(ctx)
            .map_err(|e| ChatTemplateError::Render(describe(&e)))
    }

    /// Render and tokenize (no BOS/EOS insertion beyond what the template writes, as in
    /// Hugging Face's `apply_chat_template`). Only the template's own markers become
    /// special ids: a special token's text inside a message is encoded as text (see
    /// [`super::literal`]).
    pub fn render_ids(
        &self,
        tok: &TextTokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, ChatTemplateError> {
        let segments = self.render_segments(tok, messages, add_generation_prompt)?;
        Ok(literal::encode(tok, &segments)?)
    }

    /// The rendering cut at the template's own markers.
    fn render_segments(
        &self,
        tok: &TextTokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<Segment>, ChatTemplateError> {
        let hidden = literal::stand_in_messages(tok, messages)?;
        let rendered = self.render(&hidden, add_generation_prompt)?;
        Ok(literal::split_rendered(tok, &rendered)?)
    }

    /// Whether every turn of `conversation` extends the ids cached after the previous one
    /// (see the module docs). If the conversation does not end with an assistant message, a
    /// short reply is appended for the check; after the last assistant message a short user
    /// message is appended, so a one-exchange conversation is checked too.
    pub fn prefix_stable(
        &self,
        tok: &TextTokenizer,
        conversation: &[ChatMessage],
    ) -> Result<bool, ChatTemplateError> {
        Ok(self.prefix_stability(tok, conversation)? == PrefixStability::Stable)
    }

    /// Like [`Self::prefix_stable`], saying where and why it fails.
    ///
    /// For every assistant message at index `i > 0`: the ids of
    /// `render(conv[..i], generation prompt)` must be a prefix of those of
    /// `render(conv[..=i])` (the reply continues the prompt), and the cache after the reply,
    /// i.e. those ids up to and including the first end-of-turn id of the reply (see
    /// [`TextTokenizer::eos_ids`]), must be a prefix of the ids of
    /// `render(conv[..=i+1], generation prompt)`.
    pub fn prefix_stability(
        &self,
        tok: &TextTokenizer,
        conversation: &[ChatMessage],
    ) -> Result<PrefixStability, ChatTemplateError> {
        let mut conv = conversation.to_vec();
        if conv.last().is_some_and(|m| m.role != Role::Assistant) {
            conv.push(ChatMessage::assistant("Sure. Here is a short answer."));
        }
        for i in 1..conv.len() {
            if conv[i].role != Role::Assistant {
                continue;
            }
            let prompt = self.render_ids(tok, &conv[..i], true)?;
            let with_reply = self.render_ids(tok, &conv[..=i], false)?;
            if !with_reply.starts_with(&prompt) {
                return Ok(PrefixStability::Unstable {
                    message_index: i,
                    reason: format!(
                        "the generation prompt is not a prefix of the rendered assistant turn ({})",
                        describe_id_divergence(tok, &prompt, &with_reply)
                    ),
                });
            }
            let reply = &with_reply[prompt.len()..];
            let cut = reply
                .iter()
                .position(|id| tok.eos_ids().contains(id))
                .map_or(reply.len(), |p| p + 1);
            let mut cache = prompt;
            cache.extend_from_slice(&reply[..cut]);

            let mut next = conv[..=i].to_vec();
            next.push(
                conv.get(i + 1)
                    .cloned()
                    .unwrap_or_else(|| ChatMessage::user("Thanks! One more question.")),
            );
            let next_ids = self.render_ids(tok, &next, true)?;
            if !next_ids.starts_with(&cache) {
                return Ok(PrefixStability::Unstable {
                    message_index: i,
                    reason: format!(
                        "the next turn does not extend the cached ids ({})",
                        describe_id_divergence(tok, &cache, &next_ids)
                    ),
                });
            }
        }
        Ok(PrefixStability::Stable)
    }

    /// The ids to append to `cached_ids` so that the cache holds `conversation` rendered
    /// (with the generation prompt when `add_generation_prompt`).
    ///
    /// `cached_ids` are the ids the cache holds, typically the previous prompt followed by
    /// the ids the model generated (with or without the end-of-turn id it stopped on);
    /// `conversation` is the whole conversation, whose assistant messages hold the replies
    /// exactly as decoded (not trimmed). The check is done on text: the rendered
    /// conversation must start with the decoded cache. When the cache ends with, or the new
    /// text starts with, a special token the new ids are tokenized on their own; otherwise
    /// the whole conversation is re-tokenized and must start with `cached_ids`.
    ///
    /// Errors with [`ChatTemplateError::NotPrefixStable`] when the cache cannot be extended.
    pub fn incremental_ids(
        &self,
        tok: &TextTokenizer,
        cached_ids: &[u32],
        conversation: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, ChatTemplateError> {
        let segments = self.render_segments(tok, conversation, add_generation_prompt)?;
        let text: String = segments.iter().map(|s| s.text.as_str()).collect();
        let Some(&last_cached) = cached_ids.last() else {
            return Ok(literal::encode(tok, &segments)?);
        };
        let cached_text = tok.decode(cached_ids)?;
        let Some(delta) = text.strip_prefix(cached_text.as_str()) else {
            return Err(ChatTemplateError::NotPrefixStable {
                detail: format!(
                    "the rendered conversation does not start with the cached text ({})",
                    describe_text_divergence(&cached_text, &text)
                ),
            });
        };
        // A cache that ends inside a marker's text (whitespace an lstrip token takes
        // along) has no delta of its own: only the whole conversation can say.
        if let Some(rest) = literal::from_offset(&segments, cached_text.len()) {
            let delta_ids = literal::encode(tok, &rest)?;
            let clean_cut = tok.is_hard_boundary(last_cached)
                || delta_ids
                    .first()
                    .is_some_and(|&id| tok.is_hard_boundary(id));
            if clean_cut || delta_ids.is_empty() {
                return Ok(delta_ids);
            }
        }
        let full = literal::encode(tok, &segments)?;
        if full.starts_with(cached_ids) {
            return Ok(full[cached_ids.len()..].to_vec());
        }
        Err(ChatTemplateError::NotPrefixStable {
            detail: format!(
                "the new text {:?} joins the cached text without a special token between them, and re-tokenizing the conversation changes the cached ids ({})",
                excerpt(delta, 40),
                describe_id_divergence(tok, cached_ids, &full)
            ),
        })
    }
}

fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

fn excerpt(s: &str, max_chars: usize) -> String {
    let mut out: String = s.chars().take(max_chars).collect();
    if s.chars().count() > max_chars {
        out.push('…');
    }
    out
}

fn describe_text_divergence(cached: &str, rendered: &str) -> String {
    let at = cached
        .char_indices()
        .zip(rendered.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| cached.len().min(rendered.len()));
    let start = cached[..at]
        .char_indices()
        .rev()
        .nth(20)
        .map_or(0, |(i, _)| i);
    format!(
        "they differ at byte {at}: cache has {:?}, render has {:?}",
        excerpt(&cached[start..], 60),
        excerpt(rendered.get(start..).unwrap_or(""), 60)
    )
}

fn describe_id_divergence(tok: &TextTokenizer, prefix: &[u32], full: &[u32]) -> String {
    let at = prefix
        .iter()
        .zip(full.iter())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| prefix.len().min(full.len()));
    let show = |ids: &[u32]| -> String {
        let end = (at + 4).min(ids.len());
        let ids = &ids[at.min(end)..end];
        let toks: Vec<String> = ids
            .iter()
            .map(|&id| tok.token_to_str(id).unwrap_or_else(|| format!("#{id}")))
            .collect();
        format!("{ids:?} {toks:?}")
    };
    format!(
        "first difference at id #{at}: expected {}, got {}",
        show(prefix),
        show(full)
    )
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `tojson` as Hugging Face defines it: Python's `json.dumps(x, ensure_ascii=False,
/// indent=indent)`, i.e. `", "` / `": "` separators, no HTML escaping, non-ASCII kept.
fn py_tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_usize() {
            Some(n) => Some(" ".repeat(n)),
            None => Some(v.as_str().map(str::to_string).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                )
            })?),
        },
        None => None,
    };
    // Accepted for compatibility; maps are already in a fixed order.
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_py_json(value, indent.as_deref(), 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn write_py_json(
    v: &Value,
    indent: Option<&str>,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    let json_str = |s: &str| {
        serde_json::to_string(s).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&v.to_string()),
        ValueKind::String => out.push_str(&json_str(v.as_str().unwrap_or_default())?),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                write_py_json(item, indent, level + 1, out)?;
            }
            newline(out, level);
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                let k = match key.as_str() {
                    Some(s) => s.to_string(),
                    None => key.to_string(),
                };
                out.push_str(&json_str(&k)?);
                out.push_str(": ");
                write_py_json(&v.get_item(key)?, indent, level + 1, out)?;
            }
            newline(out, level);
            out.push('}');
        }
        _ => out.push_str(&json_str(&v.to_string())?),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nDefault.<|im_end|>\\n' }}{%- endif %}\n{%- for message in messages %}\n    {%- if not (message.role == 'system' and loop.first) %}\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n";

    #[test]
    fn renders_chatml_with_default_system() {
        let t = ChatTemplate::new(CHATML, None, None).unwrap();
        let msgs = [ChatMessage::user("hi"), ChatMessage::assistant("hello")];
        assert_eq!(
            t.render(&msgs, false).unwrap(),
            "<|im_start|>system\nDefault.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
        );
        let with_sys = [ChatMessage::system("S"), ChatMessage::user("q")];
        assert_eq!(
            t.render(&with_sys, true).unwrap(),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn trim_and_lstrip_blocks_like_hf() {
        let src = "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        let out = t
            .render(&[ChatMessage::user("a"), ChatMessage::user("b")], false)
            .unwrap();
        assert_eq!(out, "[a]\n[b]\n");
    }

    #[test]
    fn hf_globals_and_python_methods() {
        let src = "{{ bos_token }}{% if tools is none %}T{% endif %}{% for m in messages %}{{ m.content.strip() | upper }}{% if m.content.startswith(' x') %}!{% endif %}{{ m.role.title() }}{% endfor %}{% if not add_generation_prompt %}{{ eos_token }}{% endif %}";
        let t = ChatTemplate::new(src, Some("<s>".into()), Some("</s>".into())).unwrap();
        let out = t.render(&[ChatMessage::user(" xy ")], false).unwrap();
        assert_eq!(out, "<s>TXY!User</s>");
        let undefined = ChatTemplate::new("[{{ bos_token }}]", None, None).unwrap();
        assert_eq!(undefined.render(&[], false).unwrap(), "[]");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok";
        let t = ChatTemplate::new(src, None, None).unwrap();
        let err = t.render(&[ChatMessage::system("s")], false).unwrap_err();
        assert!(err.to_string().contains("first must be user"), "{err}");
        assert_eq!(t.render(&[ChatMessage::user("u")], false).unwrap(), "ok");
    }

    #[test]
    fn syntax_error_is_reported() {
        let err = ChatTemplate::new("{% for %}", None, None).unwrap_err();
        assert!(matches!(err, ChatTemplateError::Syntax(_)), "{err}");
    }

    #[test]
    fn tojson_is_python_style() {
        let t = ChatTemplate::new(
            "{{ messages[0] | tojson }}|{{ [1, 'é<>', none, true] | tojson }}|{{ {'a': [1]} | tojson(indent=2) }}",
            None,
            None,
        )
        .unwrap();
        let out = t.render(&[ChatMessage::user("a\"b")], false).unwrap();
        assert_eq!(
            out,
            "{\"role\": \"user\", \"content\": \"a\\\"b\"}|[1, \"é<>\", null, true]|{\n  \"a\": [\n    1\n  ]\n}"
        );
    }

    #[test]
    fn loop_controls_work() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}",
            None,
            None,
        )
        .unwrap();
        let msgs = [ChatMessage::user("a"), ChatMessage::user("b")];
        assert_eq!(t.render(&msgs, false).unwrap(), "a");
    }

    fn chatml_conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::user("the thing"),
            ChatMessage::assistant("the ring"),
            ChatMessage::user("thing?"),
            ChatMessage::assistant("\n  leading newline and spaces"),
            ChatMessage::user("ok"),
        ]
    }

    #[test]
    fn chatml_is_prefix_stable_and_extends_the_cache() {
        let tok = crate::text::tokenizer::test_support::tokenizer();
        let t = ChatTemplate::for_tokenizer(CHATML, &tok).unwrap();
        let conv = chatml_conversation();
        assert!(t.prefix_stable(&tok, &conv[..3]).unwrap());

        // Simulate generation: prompt ids, then the reply's ids and the <|im_end|> it stopped on.
        let end = tok.token_to_id("<|im_end|>").unwrap();
        let mut cache = t.render_ids(&tok, &conv[..1], true).unwrap();
        cache.extend(tok.encode_raw(&conv[1].content).unwrap());
        cache.push(end);
        let add = t.incremental_ids(&tok, &cache, &conv[..3], true).unwrap();
        let full = t.render_ids(&tok, &conv[..3], true).unwrap();
        assert_eq!([cache.as_slice(), add.as_slice()].concat(), full);

        // The same without the end-of-turn id in the cache.
        cache.pop();
        let add = t.incremental_ids(&tok, &cache, &conv[..3], true).unwrap();
        assert_eq!(add[0], end);
        assert_eq!([cache.as_slice(), add.as_slice()].concat(), full);

        // A reply generated in non-canonical pieces (byte by byte) still extends.
        let mut cache = t.render_ids(&tok, &conv[..3], true).unwrap();
        let table = crate::text::tokenizer::test_support::byte_symbols();
        for b in conv[3].content.bytes() {
            cache.push(tok.token_to_id(&table[b as usize].to_string()).unwrap());
        }
        cache.push(end);
        let add = t.incremental_ids(&tok, &cache, &conv, true).unwrap();
        let expect_text = t.render(&conv, true).unwrap();
        let got = tok
            .decode(&[cache.as_slice(), add.as_slice()].concat())
            .unwrap();
        assert_eq!(got, expect_text);

        // Empty cache: everything.
        assert_eq!(
            t.incremental_ids(&tok, &[], &conv[..1], true).unwrap(),
            t.render_ids(&tok, &conv[..1], true).unwrap()
        );
    }

    #[test]
    fn leading_whitespace_reply_is_reported_by_the_canonical_check() {
        let tok = crate::text::tokenizer::test_support::tokenizer();
        let t = ChatTemplate::for_tokenizer(CHATML, &tok).unwrap();
        // "assistant\n" + "\n  ..." re-tokenizes the newline run together.
        match t.prefix_stability(&tok, &chatml_conversation()).unwrap() {
            PrefixStability::Unstable { message_index, .. } => assert_eq!(message_index, 3),
            PrefixStability::Stable => panic!("expected unstable"),
        }
    }

    #[test]
    fn history_rewriting_template_is_not_prefix_stable() {
        let tok = crate::text::tokenizer::test_support::tokenizer();
        // Prints the number of messages up front, so every turn changes the first tokens.
        let src = "<|im_start|>system\n{{ messages | length }}<|im_end|>\n{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::for_tokenizer(src, &tok).unwrap();
        let conv = [
            ChatMessage::user("a"),
            ChatMessage::assistant("b"),
            ChatMessage::user("c"),
        ];
        assert!(!t.prefix_stable(&tok, &conv).unwrap());
        let mut cache = t.render_ids(&tok, &conv[..1], true).unwrap();
        cache.extend(tok.encode_raw("b<|im_end|>").unwrap());
        let err = t.incremental_ids(&tok, &cache, &conv, true).unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::NotPrefixStable { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("prefilled again"), "{err}");
    }

    #[test]
    fn role_serialises_lowercase() {
        let m = ChatMessage::assistant("x");
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            "{\"role\":\"assistant\",\"content\":\"x\"}"
        );
    }
}
