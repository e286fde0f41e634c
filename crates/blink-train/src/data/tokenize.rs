//! Conversations to training examples: the model's chat template and tokenizer give the
//! tokens, and a loss mask marks the tokens the model learns to predict.
//!
//! The mask rule (shared/golden/lora/README.md, `grads.json`): for each assistant message
//! `i` that is learned from, the tokens `P` of `messages[..i]` rendered with the generation
//! prompt must be a prefix of the tokens `F` of `messages[..=i]` rendered without it; the
//! targets are `F[len(P)..=e]`, where `e` is the first end-of-turn token at or after
//! `len(P)`. So the reply and the token closing it are learned; the turns before it, the
//! turn opening (`<|im_start|>assistant\n`) and what the template writes after the
//! end-of-turn token (a newline) are not. `F[..=e]` must also begin the whole
//! conversation's tokens, which are what the example holds.
//!
//! Text is tokenized as the engine tokenizes chat prompts: special-token texts parsed, BOS
//! put first when the tokenizer adds one (the template already dropped a BOS text it
//! writes), never an EOS appended.

use std::ops::Range;

use blink_text::{ChatMessage, ChatTemplate, Tokenizer};

use super::error::{refuse_lines, DataError, LineError};
use super::jsonl::Conversation;

/// One tokenized training example.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    /// The line of the JSONL file it came from (1-based).
    pub line: usize,
    /// The whole conversation's tokens; the example runs as its own sequence, positions
    /// `0..tokens.len()`.
    pub tokens: Vec<u32>,
    /// `targets[i]`: token `i` is learned, its loss taken from the logits at position
    /// `i - 1`. `targets[0]` is always false.
    pub targets: Vec<bool>,
}

impl Example {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// How many tokens are learned.
    pub fn n_targets(&self) -> usize {
        self.targets.iter().filter(|&&t| t).count()
    }
}

/// Tokenizes conversations with one model's tokenizer and chat template.
pub struct ChatEncoder<'a> {
    tokenizer: &'a Tokenizer,
    template: &'a ChatTemplate,
    /// The token that closes an assistant's turn.
    end_of_turn: u32,
}

impl<'a> ChatEncoder<'a> {
    /// The end of a turn is the tokenizer's end-of-turn token, else its end-of-sequence token.
    pub fn new(tokenizer: &'a Tokenizer, template: &'a ChatTemplate) -> Result<ChatEncoder<'a>, DataError> {
        let end_of_turn = tokenizer.eot().or(tokenizer.eos()).ok_or(DataError::NoEndOfTurn)?;
        Ok(ChatEncoder { tokenizer, template, end_of_turn })
    }

    /// The token that ends each learned reply.
    pub fn end_of_turn(&self) -> u32 {
        self.end_of_turn
    }

    /// Tokenizes every conversation; all lines that fail are listed in the error.
    pub fn encode_all(&self, conversations: &[Conversation]) -> Result<Vec<Example>, DataError> {
        if conversations.is_empty() {
            return Err(DataError::Empty);
        }
        let mut examples = Vec::with_capacity(conversations.len());
        let mut errors = Vec::new();
        for c in conversations {
            match self.encode(c) {
                Ok(e) => examples.push(e),
                Err(e) => errors.push(e),
            }
        }
        refuse_lines(errors)?;
        Ok(examples)
    }

    /// Tokenizes one conversation and marks its targets.
    pub fn encode(&self, conversation: &Conversation) -> Result<Example, LineError> {
        let line = conversation.line;
        let chat: Vec<ChatMessage> = conversation
            .messages
            .iter()
            .map(|m| ChatMessage::new(m.role.as_str(), m.content.as_str()))
            .collect();
        let tokens = self.tokens(&chat, false).map_err(|e| LineError::new(line, format!("rendering the conversation: {e}")))?;
        let mut targets = vec![false; tokens.len()];
        for (i, _) in conversation.messages.iter().enumerate().filter(|(_, m)| m.learn) {
            let span = self.reply_span(&chat, i, &tokens).map_err(|reason| LineError::new(line, reason))?;
            targets[span].fill(true);
        }
        Ok(Example { line, tokens, targets })
    }

    /// The targets of the reply `chat[i]`, as a range of the conversation's tokens `full`.
    fn reply_span(&self, chat: &[ChatMessage], i: usize, full: &[u32]) -> Result<Range<usize>, String> {
        if self.tokenizer.encode(&chat[i].content, false, true).contains(&self.end_of_turn) {
            let text = self.tokenizer.token_text(self.end_of_turn).unwrap_or("?");
            return Err(format!("messages[{i}] contains the end-of-turn token's text `{text}`"));
        }
        let prompt = self.tokens(&chat[..i], true).map_err(|e| format!("rendering the prompt for messages[{i}]: {e}"))?;
        let with_reply = self.tokens(&chat[..=i], false).map_err(|e| format!("rendering up to messages[{i}]: {e}"))?;
        if prompt.is_empty() {
            return Err(format!("the chat template writes nothing before messages[{i}]: its first token has nothing to be predicted from"));
        }
        if !with_reply.starts_with(&prompt) {
            return Err(format!(
                "the generation prompt's tokens for messages[{i}] are not a prefix of the conversation's tokens up to it \
                 (the template renders the earlier turns differently once the reply follows)"
            ));
        }
        let Some(end) = with_reply[prompt.len()..].iter().position(|&t| t == self.end_of_turn) else {
            let text = self.tokenizer.token_text(self.end_of_turn).unwrap_or("?");
            return Err(format!("the chat template does not close messages[{i}] with the end-of-turn token `{text}`"));
        };
        let end = prompt.len() + end;
        if !full.starts_with(&with_reply[..=end]) {
            return Err(format!(
                "the conversation's tokens do not begin with its tokens up to the end of messages[{i}] \
                 (the template renders that reply differently when later messages follow)"
            ));
        }
        Ok(prompt.len()..end + 1)
    }

    /// `messages` rendered and tokenized as the engine tokenizes chat prompts.
    fn tokens(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<Vec<u32>, blink_text::TemplateError> {
        let text = self.template.render(messages, add_generation_prompt)?;
        let tok = self.tokenizer;
        let mut out = tok.encode(&text, false, true);
        if let Some(bos) = tok.bos().filter(|_| tok.add_bos()) {
            out.insert(0, bos);
        }
        Ok(out)
    }
}
