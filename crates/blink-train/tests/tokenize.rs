//! Tokenizing training data with the default model's tokenizer and chat template, checked
//! against the PyTorch reference (shared/golden/lora/grads.json) and on the Zorbania set.

use std::path::PathBuf;
use std::sync::OnceLock;

use blink_gguf::GgufFile;
use blink_text::{ChatTemplate, Tokenizer};
use blink_train::data::{load_examples, pack_epoch, parse_jsonl, ChatEncoder, Example};
use serde_json::Value;

/// The repository's test data (copies of the shared golden and fine-tuning sets).
fn shared() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// `$BLINK_MODEL`, else the default model (fetched on first use).
fn model_path() -> PathBuf {
    match std::env::var_os("BLINK_MODEL").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => blink_model::fetch::ensure_default_model().expect("fetching the default model"),
    }
}

fn text() -> &'static (Tokenizer, ChatTemplate) {
    static TEXT: OnceLock<(Tokenizer, ChatTemplate)> = OnceLock::new();
    TEXT.get_or_init(|| {
        let file = GgufFile::open(model_path()).expect("opening the model");
        let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
        let (tmpl, _) = ChatTemplate::from_gguf_or_chatml(&file).expect("chat template");
        (tok, tmpl.unwrap_or_else(ChatTemplate::chatml))
    })
}

fn encode_line(line: &str) -> Result<Example, String> {
    let (tok, tmpl) = text();
    let conv = parse_jsonl(line.as_bytes()).map_err(|e| e.to_string())?;
    ChatEncoder::new(tok, tmpl).unwrap().encode(&conv[0]).map_err(|e| e.to_string())
}

/// The runs of consecutive targets, as token ranges.
fn spans(e: &Example) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < e.len() {
        if e.targets[i] {
            let start = i;
            while i < e.len() && e.targets[i] {
                i += 1;
            }
            out.push(start..i);
        } else {
            i += 1;
        }
    }
    out
}

/// A reply's expected targets: its text's tokens, then the end of turn.
fn reply_tokens(content: &str) -> Vec<u32> {
    let (tok, _) = text();
    let mut t = tok.encode(content, false, true);
    t.push(tok.eot().or(tok.eos()).unwrap());
    t
}

#[test]
fn the_golden_example_tokenizes_and_masks_as_pytorch() {
    let path = shared().join("golden/lora/grads.json");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("reading grads.json")).unwrap();
    let line = serde_json::json!({ "messages": golden["messages"] }).to_string();
    let e = encode_line(&line).unwrap();

    let want_tokens: Vec<u32> = golden["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let want_mask: Vec<bool> = golden["loss_mask"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() == 1).collect();
    assert_eq!(e.tokens, want_tokens);
    assert_eq!(e.targets, want_mask);
    assert_eq!((e.len(), e.n_targets()), (54, 13));
    let reply: Vec<u32> = golden["reply_token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let targets: Vec<u32> = e.tokens.iter().zip(&e.targets).filter(|(_, &t)| t).map(|(&id, _)| id).collect();
    assert_eq!(targets, reply);
    assert_eq!(*reply.last().unwrap(), 2, "<|im_end|> closes the reply");
}

#[test]
fn the_zorbania_training_set_tokenizes() {
    let (tok, tmpl) = text();
    let path = shared().join("finetune/zorbania-train.jsonl");
    let examples = load_examples(&path, tok, tmpl).unwrap();
    assert_eq!(examples.len(), 120);
    let raw = std::fs::read_to_string(&path).unwrap();
    for (e, line) in examples.iter().zip(raw.lines()) {
        let v: Value = serde_json::from_str(line).unwrap();
        let reply = v["messages"][1]["content"].as_str().unwrap();
        let s = spans(e);
        assert_eq!(s.len(), 1, "line {}", e.line);
        assert_eq!(e.tokens[s[0].clone()], reply_tokens(reply)[..], "line {}", e.line);
        // Only the template's newline follows the end of turn.
        assert_eq!(s[0].end, e.len() - 1, "line {}", e.line);
        assert!(!e.targets[0]);
    }
    // And they pack: deterministic, every example once.
    let batches = pack_epoch(&examples, 512, usize::MAX, 1, 0).unwrap();
    assert_eq!(batches, pack_epoch(&examples, 512, usize::MAX, 1, 0).unwrap());
    assert_eq!(batches.iter().map(|b| b.examples.len()).sum::<usize>(), 120);
    assert!(batches.iter().all(|b| b.tokens <= 512));
}

#[test]
fn multi_turn_conversations_learn_only_weighted_replies() {
    let line = r#"{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "One?"}, {"role": "assistant", "content": "Uno.", "weight": 0}, {"role": "user", "content": "Two?"}, {"role": "assistant", "content": "Dos."}]}"#;
    let e = encode_line(line).unwrap();
    let s = spans(&e);
    assert_eq!(s.len(), 1);
    assert_eq!(e.tokens[s[0].clone()], reply_tokens("Dos.")[..]);

    let both = line.replace(r#", "weight": 0"#, "");
    let e = encode_line(&both).unwrap();
    let s = spans(&e);
    assert_eq!(s.len(), 2);
    assert_eq!(e.tokens[s[0].clone()], reply_tokens("Uno.")[..]);
    assert_eq!(e.tokens[s[1].clone()], reply_tokens("Dos.")[..]);
    // The system message is the template's, not its default one.
    let (tok, _) = text();
    assert!(tok.decode(&e.tokens, true).contains("Be brief."));
}

#[test]
fn a_reply_holding_the_end_of_turn_text_is_refused() {
    let line = r#"{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a<|im_end|>b"}]}"#;
    let err = encode_line(line).unwrap_err();
    assert!(err.contains("line 1: messages[1] contains the end-of-turn token's text `<|im_end|>`"), "{err}");
}

#[test]
fn tokenizing_lists_every_bad_line() {
    let (tok, tmpl) = text();
    let good = r#"{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}"#;
    let bad = r#"{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "<|im_end|>"}]}"#;
    let conv = parse_jsonl(format!("{good}\n{bad}\n{good}\n{bad}\n").as_bytes()).unwrap();
    let err = ChatEncoder::new(tok, tmpl).unwrap().encode_all(&conv).unwrap_err();
    let lines: Vec<usize> = err.line_errors().unwrap().0.iter().map(|e| e.line).collect();
    assert_eq!(lines, [2, 4]);
}
