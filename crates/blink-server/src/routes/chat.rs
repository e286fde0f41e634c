//! `POST /v1/chat/completions`: render the conversation with the model's chat template,
//! generate, and answer whole or streamed.

use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::stream::{self, StreamShape};
use super::{json_response, unix_now};
use crate::body::read_json;
use crate::error::ApiError;
use crate::generate::{End, Generation, Piece};
use crate::openai::request::parse_chat;
use crate::openai::response::{chat_chunk, chat_completion, chat_logprobs, new_id, usage_chunk, Meta};
use crate::state::App;

pub async fn chat(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let started = Instant::now();
    let ready = app.ready()?;
    let json = read_json(body, app.opts.max_body, app.opts.body_timeout).await?;
    let req = parse_chat(&json)?;
    let (adapter, model_name) = ready.pick(req.common.model.as_deref(), req.common.lora.as_deref()).await?;
    let prompt = ready.chat_prompt(&req.messages)?;
    let meta = Meta { id: new_id("chatcmpl-"), created: unix_now(), model: model_name };
    let logprobs = req.common.logprobs.is_some();
    let gen = Generation::start(app.clone(), ready.clone(), prompt, "messages", &req.common, adapter, started)?;
    if req.common.stream {
        let shape = ChatStream { meta, logprobs, include_usage: req.common.include_usage };
        return Ok(stream::respond(gen, shape));
    }
    let (text, tokens, end) = gen.collect().await?;
    let lp = logprobs.then(|| chat_logprobs(&ready.tokenizer, &tokens));
    Ok(json_response(&chat_completion(&meta, &text, end.finish, &end.usage, lp)).into_response())
}

struct ChatStream {
    meta: Meta,
    logprobs: bool,
    include_usage: bool,
}

impl StreamShape for ChatStream {
    fn opening(&self) -> Vec<Value> {
        vec![chat_chunk(&self.meta, json!({"role": "assistant", "content": ""}), None, None, self.include_usage)]
    }

    fn piece(&self, gen: &Generation, piece: &Piece) -> Option<Value> {
        if piece.text.is_empty() && piece.tokens.is_empty() {
            return None;
        }
        let lp = self.logprobs.then(|| chat_logprobs(&gen.ready().tokenizer, &piece.tokens));
        Some(chat_chunk(&self.meta, json!({"content": piece.text}), lp, None, self.include_usage))
    }

    fn closing(&self, end: &End) -> Vec<Value> {
        let mut out = vec![chat_chunk(&self.meta, json!({}), None, Some(end.finish), self.include_usage)];
        if self.include_usage {
            out.push(usage_chunk(&self.meta, "chat.completion.chunk", &end.usage));
        }
        out
    }
}
