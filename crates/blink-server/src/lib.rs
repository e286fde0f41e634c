//! Blink's OpenAI-compatible HTTP server (`blink serve`).
//!
//! axum routes on hyper, on a tokio runtime. Requests are parsed and validated
//! (`openai`), tokenized (chat template for chat), and submitted to the serving engine
//! (`blink_engine::serve`); its token events are detokenized, cut at stop strings and
//! written out whole or as server-sent events (`generate`, `routes`). Everything but the
//! forward pass — parsing, templating, tokenizing, detokenizing, SSE — runs on the tokio
//! runtime, never on the engine's compute threads.
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
//! `GET /health`, `POST /tokenize`, `POST /detokenize`, `GET /metrics`, the files and
//! fine-tuning jobs endpoints (`/v1/files`, `/v1/fine_tuning/jobs`, with `--state-dir`;
//! `finetune` starts the jobs and what trains them), and a chat page at `/`.
//!
//! `client` is a small HTTP/SSE client for driving a server (bench-serve, tests).

pub mod adapters;
pub mod body;
pub mod client;
pub mod error;
pub mod finetune;
pub mod generate;
pub mod metrics;
pub mod openai;
pub mod routes;
pub mod server;
pub mod state;

pub use server::Server;
pub use adapters::AdapterOptions;
pub use finetune::{FinetuneMode, FinetuneOptions};
pub use state::{ModelOptions, Ready, ServerOptions};
