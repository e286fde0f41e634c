//! `POST /v1/completions`: complete a raw prompt (special tokens written in it are parsed,
//! as llama.cpp's server does), whole or streamed.

use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::stream::{self, StreamShape};
use super::{json_response, unix_now};
use crate::body::read_json;
use crate::error::ApiError;
use crate::generate::{End, Generation, Piece};
use crate::openai::request::{parse_completion, Prompt};
use crate::openai::response::{completion, completion_logprobs, new_id, usage_chunk, Meta};
use crate::state::App;

pub async fn completions(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let started = Instant::now();
    let ready = app.ready()?;
    let json = read_json(body, app.opts.max_body, app.opts.body_timeout).await?;
    let req = parse_completion(&json)?;
    let (adapter, model_name) = ready.pick(req.common.model.as_deref(), req.common.lora.as_deref()).await?;
    let tok = &ready.tokenizer;
    let prompt = match req.prompt {
        Prompt::Text(text) => tok.encode(&text, true, true),
        Prompt::Tokens(ids) => {
            let vocab = tok.vocab_size();
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::param("prompt", format!("token id {bad} is outside the vocabulary of {vocab}")));
            }
            ids
        }
    };
    let meta = Meta { id: new_id("cmpl-"), created: unix_now(), model: model_name };
    let logprobs = req.common.logprobs.is_some();
    let gen = Generation::start(app.clone(), ready.clone(), prompt, "prompt", &req.common, adapter, started)?;
    if req.common.stream {
        let shape = CompletionStream { meta, logprobs, include_usage: req.common.include_usage };
        return Ok(stream::respond(gen, shape));
    }
    let (text, tokens, end) = gen.collect().await?;
    let lp = logprobs.then(|| completion_logprobs(&ready.tokenizer, &tokens));
    let body = completion(&meta, &text, Some(end.finish), lp, Some(&end.usage), false);
    Ok(json_response(&body).into_response())
}

struct CompletionStream {
    meta: Meta,
    logprobs: bool,
    include_usage: bool,
}

impl StreamShape for CompletionStream {
    fn opening(&self) -> Vec<Value> {
        Vec::new()
    }

    fn piece(&self, gen: &Generation, piece: &Piece) -> Option<Value> {
        if piece.text.is_empty() && piece.tokens.is_empty() {
            return None;
        }
        let lp = self.logprobs.then(|| completion_logprobs(&gen.ready().tokenizer, &piece.tokens));
        Some(completion(&self.meta, &piece.text, None, lp, None, self.include_usage))
    }

    fn closing(&self, end: &End) -> Vec<Value> {
        let mut out = vec![completion(&self.meta, "", Some(end.finish), None, None, self.include_usage)];
        if self.include_usage {
            out.push(usage_chunk(&self.meta, "text_completion", &end.usage));
        }
        out
    }
}
