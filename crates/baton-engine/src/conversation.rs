//! The conversation as text messages and as the token ids the caches hold. Both models
//! share one tokenizer and template family, so one id history serves both; each cache
//! holds a prefix of it.

use baton_runtime::text::{ChatMessage, ChatTemplate, ChatTemplateError, TextTokenizer};

#[derive(Debug, Clone, Default)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    /// Rendered prompt and generated ids so far, including each reply's end-of-turn id.
    pub history: Vec<u32>,
}

impl Conversation {
    pub fn new(system: Option<&str>) -> Self {
        Self {
            messages: system.map(ChatMessage::system).into_iter().collect(),
            history: Vec::new(),
        }
    }

    /// Add a user message and the opening of the assistant's reply; returns how many ids
    /// were appended. The message is kept in the tokenizer's normal form (see
    /// [`TextTokenizer::normalize`]), as are the messages before it.
    pub fn push_user(
        &mut self,
        template: &ChatTemplate,
        tok: &TextTokenizer,
        text: &str,
    ) -> Result<usize, ChatTemplateError> {
        let mut messages = self.messages.clone();
        for m in messages.iter_mut() {
            m.content = tok.normalize(&m.content)?;
        }
        messages.push(ChatMessage::user(tok.normalize(text)?));
        let ids = template.incremental_ids(tok, &self.history, &messages, true)?;
        self.messages = messages;
        self.history.extend_from_slice(&ids);
        Ok(ids.len())
    }

    /// Add the assistant's reply as generated (`ids` may end with the end-of-turn id).
    pub fn push_reply(
        &mut self,
        tok: &TextTokenizer,
        ids: &[u32],
    ) -> Result<String, ChatTemplateError> {
        let body: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|id| !tok.eos_ids().contains(id))
            .collect();
        let text = tok.decode(&body)?;
        self.messages.push(ChatMessage::assistant(text.clone()));
        self.history.extend_from_slice(ids);
        Ok(text)
    }

    pub fn len(&self) -> usize {
        self.history.len()
    }

    pub fn is_empty(&self) -> bool {
        self.history.is_empty()
    }
}
