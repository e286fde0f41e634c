//! One request's generation, from the engine's token events to final text.
//!
//! The engine sends token ids; here they become text through a `TextStream` (which holds
//! back partial UTF-8 and possible beginnings of a stop string), so text is released only
//! when final. When a stop string completes, the submission is dropped, which cancels the
//! rest of the generation. Token log-probabilities are released with the text they start in.
//! Server-side latency metrics (time to first token, time between tokens) are recorded here.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use blink_engine::serve::{Event, Request, Submission, Usage};
use blink_engine::{FinishReason, SamplingParams};
use blink_model::lora::LoraMix;
use blink_text::TextStream;

use crate::error::ApiError;
use crate::openai::request::Common;
use crate::openai::response::TokenOut;
use crate::state::{App, Ready};

/// How a generation ended.
#[derive(Clone, Copy, Debug)]
pub struct End {
    pub finish: &'static str,
    pub usage: Usage,
}

/// Text released by one step of [`Generation::next`].
#[derive(Debug, Default)]
pub struct Piece {
    pub text: String,
    /// Tokens whose text starts in what has been released (only when log-probabilities were asked for).
    pub tokens: Vec<TokenOut>,
    /// Set on the last piece.
    pub end: Option<End>,
}

/// A submitted request being read.
pub struct Generation {
    app: App,
    ready: Arc<Ready>,
    /// `None` once the request ended or was cancelled by a stop string.
    sub: Option<Submission>,
    text: TextStream,
    logprobs: bool,
    prompt_tokens: usize,
    /// Prompt tokens the engine found in its prefix cache (told at admission).
    cached_tokens: usize,
    /// Token events read from the engine.
    consumed: usize,
    pending: VecDeque<TokenOut>,
    started: Instant,
    last_token: Option<Instant>,
    done: bool,
}

impl Generation {
    /// Check the request against the context limit and submit it to the engine.
    ///
    /// `prompt_field` is where the request had the prompt (`messages` or `prompt`), for
    /// errors; `started` is when the request arrived (time to first token is measured from
    /// it).
    pub fn start(
        app: App,
        ready: Arc<Ready>,
        prompt: Vec<u32>,
        prompt_field: &'static str,
        common: &Common,
        adapter: Option<Arc<LoraMix>>,
        started: Instant,
    ) -> Result<Generation, ApiError> {
        let limit = ready.max_seq_len;
        let n = prompt.len();
        if n == 0 {
            return Err(ApiError::param(prompt_field, "the prompt is empty"));
        }
        if n >= limit {
            return Err(ApiError::context_length(Some(prompt_field), format!(
                "the prompt has {n} tokens but this server's context length is {limit} tokens; shorten the prompt"
            )));
        }
        let max_tokens = common.max_tokens.unwrap_or(limit - n);
        if max_tokens > limit - n {
            let field = common.max_tokens_field;
            return Err(ApiError::context_length(
                Some(field),
                format!("the prompt ({n} tokens) plus {field} ({max_tokens}) exceeds this server's context length of {limit} tokens"),
            ));
        }
        let req = Request {
            prompt,
            max_tokens,
            sampling: SamplingParams { repeat_last_n: common.sampling.repeat_last_n.min(limit), ..common.sampling.clone() },
            logprobs: common.logprobs,
            ignore_eos: common.ignore_eos,
            adapter,
        };
        let sub = ready.engine.submit(req)?;
        Ok(Generation {
            app,
            ready,
            sub: Some(sub),
            text: TextStream::new(&common.stop),
            logprobs: common.logprobs.is_some(),
            prompt_tokens: n,
            cached_tokens: 0,
            consumed: 0,
            pending: VecDeque::new(),
            started,
            last_token: None,
            done: false,
        })
    }

    /// Read the whole generation (for a non-streaming response): all its text, its tokens
    /// (when log-probabilities were asked for) and how it ended.
    pub async fn collect(mut self) -> Result<(String, Vec<TokenOut>, End), ApiError> {
        let (mut text, mut tokens) = (String::new(), Vec::new());
        while let Some(piece) = self.next().await? {
            text.push_str(&piece.text);
            tokens.extend(piece.tokens);
            if let Some(end) = piece.end {
                return Ok((text, tokens, end));
            }
        }
        Err(ApiError::internal("the generation ended without finishing"))
    }

    /// The next released text; `Ok(None)` after the piece that carried the end.
    pub async fn next(&mut self) -> Result<Option<Piece>, ApiError> {
        loop {
            if self.done {
                return Ok(None);
            }
            let Some(sub) = self.sub.as_mut() else {
                self.done = true;
                return Ok(None);
            };
            match sub.next().await {
                Some(Event::Admitted { cached_tokens }) => self.cached_tokens = cached_tokens,
                Some(Event::Token { id, logprobs }) => {
                    self.on_token_timing();
                    self.consumed += 1;
                    if self.logprobs {
                        let (logprob, top) = logprobs.map_or((0.0, Vec::new()), |l| (l.logprob, l.top));
                        self.pending.push_back(TokenOut { id, start: self.text.decoded(), logprob, top });
                    }
                    let released = self.text.push(&self.ready.tokenizer, id);
                    let piece = released.text.to_owned();
                    if released.stopped {
                        return Ok(Some(self.stopped(piece)));
                    }
                    let tokens = self.ready_tokens();
                    if !piece.is_empty() || !tokens.is_empty() {
                        return Ok(Some(Piece { text: piece, tokens, end: None }));
                    }
                }
                Some(Event::Finished { reason, usage }) => {
                    let released = self.text.finish();
                    let text = released.text.to_owned();
                    if released.stopped {
                        return Ok(Some(self.stopped(text)));
                    }
                    let tokens: Vec<TokenOut> = self.pending.drain(..).collect();
                    let finish = match reason {
                        FinishReason::Stop => "stop",
                        FinishReason::Length => "length",
                    };
                    let end = self.end(finish, usage);
                    return Ok(Some(Piece { text, tokens, end: Some(end) }));
                }
                Some(Event::Failed(msg)) => {
                    self.done = true;
                    self.sub = None;
                    return Err(ApiError::internal(format!("generation failed: {msg}")));
                }
                None => {
                    self.done = true;
                    self.sub = None;
                    return Err(ApiError::internal("the engine ended the request without finishing it"));
                }
            }
        }
    }

    /// A stop string completed: cancel the request and report what came before it.
    fn stopped(&mut self, text: String) -> Piece {
        self.sub = None;
        let stream = &self.text;
        let tokens = self.pending.drain(..).filter(|t| stream.is_released(t.start)).collect();
        let usage = Usage { prompt_tokens: self.prompt_tokens, completion_tokens: self.consumed, cached_tokens: self.cached_tokens };
        let end = self.end("stop", usage);
        Piece { text, tokens, end: Some(end) }
    }

    /// Record the end in the metrics.
    fn end(&mut self, finish: &'static str, usage: Usage) -> End {
        self.done = true;
        self.app.metrics.add_tokens(usage.prompt_tokens as u64, usage.completion_tokens as u64);
        End { finish, usage }
    }

    /// Pending tokens whose text starts inside the released text.
    fn ready_tokens(&mut self) -> Vec<TokenOut> {
        let mut out = Vec::new();
        while self.pending.front().is_some_and(|t| self.text.is_released(t.start)) {
            out.extend(self.pending.pop_front());
        }
        out
    }

    fn on_token_timing(&mut self) {
        let now = Instant::now();
        match self.last_token {
            None => self.app.metrics.ttft.observe(now.duration_since(self.started).as_secs_f64()),
            Some(prev) => self.app.metrics.itl.observe(now.duration_since(prev).as_secs_f64()),
        }
        self.last_token = Some(now);
    }

    /// Prompt tokens submitted.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// The ready model this generation runs on.
    pub fn ready(&self) -> &Arc<Ready> {
        &self.ready
    }
}
