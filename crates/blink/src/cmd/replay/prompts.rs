//! The request bodies a replay sends: streaming `/v1/completions`, greedy, `ignore_eos`
//! (so each request generates exactly its `max_tokens`), with a prompt that no other
//! request shares, so no prefix cache can serve it.
//!
//! A prompt is `prompt_tokens` token ids drawn uniformly from a range of ordinary
//! vocabulary entries (default 1000–9999: past the special and byte tokens of common
//! vocabularies, within the smallest), seeded per request. With `--text-prompts`, for
//! servers that take no ids, it is as many words drawn from a list of common English
//! words, each with its leading space (one token each in common BPE vocabularies, so about
//! the right length).

use blink_engine::rng::Rng;
use serde_json::{json, Value};

/// What kind of prompt to send.
#[derive(Clone, Debug)]
pub struct PromptStyle {
    /// Draw ids from `ids.0..=ids.1`, or words when `text`.
    pub ids: (u32, u32),
    pub text: bool,
    /// The `model` field (some servers require one).
    pub model: Option<String>,
    pub seed: u64,
}

const WORDS: [&str; 64] = [
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at",
    "which", "but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when",
    "will", "would", "who", "so", "no", "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school", "state",
    "family", "student", "group",
];

impl PromptStyle {
    /// The body of request `index` (its prompt depends on the seed and the index alone).
    pub fn body(&self, index: u64, prompt_tokens: usize, max_tokens: usize) -> Value {
        let mut rng = Rng::new(super::shapes::stream(self.seed, index.wrapping_add(1000)));
        let prompt = if self.text {
            let words: Vec<&str> = (0..prompt_tokens).map(|_| WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]).collect();
            json!(format!(" {}", words.join(" ")))
        } else {
            let span = u64::from(self.ids.1 - self.ids.0) + 1;
            json!((0..prompt_tokens).map(|_| self.ids.0 + (rng.next_u64() % span) as u32).collect::<Vec<u32>>())
        };
        let mut body = json!({
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(m) = &self.model {
            body["model"] = json!(m);
        }
        body
    }
}

/// A `LO:HI` id range.
pub fn parse_ids(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("'{s}' is not a token id range: want LO:HI, whole numbers, LO ≤ HI");
    let (a, b) = s.split_once(':').ok_or_else(bad)?;
    match (a.trim().parse::<u32>(), b.trim().parse::<u32>()) {
        (Ok(lo), Ok(hi)) if lo <= hi => Ok((lo, hi)),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_distinct_seeded_and_of_the_asked_length() {
        let style = PromptStyle { ids: (1000, 9999), text: false, model: None, seed: 1 };
        let (a, b) = (style.body(0, 64, 8), style.body(1, 64, 8));
        let ids = a["prompt"].as_array().unwrap();
        assert_eq!(ids.len(), 64);
        assert!(ids.iter().all(|v| (1000..=9999).contains(&v.as_u64().unwrap())));
        assert_ne!(a["prompt"], b["prompt"]);
        assert_eq!(a, style.body(0, 64, 8));
        assert_eq!((a["max_tokens"].as_u64(), a["ignore_eos"].as_bool(), a["stream"].as_bool()), (Some(8), Some(true), Some(true)));
        assert!(a.get("model").is_none());

        let text = PromptStyle { text: true, model: Some("m".into()), ..style };
        let t = text.body(3, 20, 4);
        assert_eq!(t["prompt"].as_str().unwrap().split_whitespace().count(), 20);
        assert_eq!(t["model"], "m");
        assert_eq!(parse_ids("5:5"), Ok((5, 5)));
        assert!(parse_ids("9:5").is_err() && parse_ids("5").is_err());
    }
}
