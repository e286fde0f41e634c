//! One module per subcommand.

pub mod bench;
pub mod bench_serve;
pub mod chat;
pub mod finetune;
pub mod info;
pub mod perplexity;
pub mod run;
pub mod serve;
pub mod tokenize;
