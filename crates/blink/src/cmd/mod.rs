//! One module per subcommand.

pub mod bench;
pub mod chat;
pub mod info;
pub mod perplexity;
pub mod run;
pub mod tokenize;
