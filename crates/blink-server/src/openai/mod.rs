//! OpenAI's wire format: request parsing and validation, and response shapes.

pub mod fields;
pub mod jobs;
pub mod request;
pub mod response;
