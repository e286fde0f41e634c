//! One module per subcommand, and `client`: the client side the load-driving ones
//! (`bench-serve`, `replay`) share.

pub mod bench;
pub mod bench_serve;
pub mod calibrate;
pub mod chat;
pub mod client;
pub mod cluster;
pub mod finetune;
pub mod info;
pub mod node;
pub mod perplexity;
pub mod plan;
pub mod profile;
pub mod replay;
pub mod run;
pub mod serve;
pub mod tokenize;
