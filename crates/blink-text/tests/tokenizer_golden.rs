//! The default model's tokenizer against llama.cpp's golden outputs
//! (testdata/golden/smollm2-135m-instruct-q4_1.json): tokenization, detokenization of generated
//! text, prompt token counts of rendered chats, and speed on a 20 KB text.

mod support;

use std::time::Instant;

use blink_gguf::GgufFile;
use blink_text::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::Value;
use support::{golden_dir, model_path};

fn golden() -> Value {
    let path = golden_dir().join("smollm2-135m-instruct-q4_1.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden JSON")
}

fn tokenizer() -> Tokenizer {
    let path = model_path();
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    Tokenizer::from_gguf(&file).expect("SmolLM2 tokenizer")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn cases<'a>(g: &'a Value, key: &str) -> &'a Vec<Value> {
    g[key].as_array().unwrap_or_else(|| panic!("golden file has no {key}[]"))
}

#[test]
fn metadata_matches_llama_cpp() {
    let t = tokenizer();
    assert_eq!(t.model_kind(), "gpt2");
    assert_eq!(t.pre(), Some("smollm"));
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!((t.bos(), t.eos()), (Some(1), Some(2)));
    assert!(!t.add_bos() && !t.add_eos());
    assert!(t.is_eog(2), "<|im_end|> ends generation");
    assert!(t.is_eog(0), "<|endoftext|> ends generation");
    assert!(!t.is_eog(1));
    assert!(t.is_control(1));
    assert_eq!(t.token_text(1), Some("<|im_start|>"));
}

#[test]
fn tokenize_cases() {
    let (t, g) = (tokenizer(), golden());
    let list = cases(&g, "tokenize");
    assert!(!list.is_empty());
    for case in list {
        let text = case["text"].as_str().expect("text");
        let want = ids(&case["ids"]);
        assert_eq!(t.encode(text, false, true), want, "tokenize {text:?}");
        // The model adds no BOS/EOS, so add_special changes nothing.
        assert_eq!(t.encode(text, true, true), want, "tokenize {text:?} with add_special");
        assert_eq!(t.decode(&want, true), text, "decode {want:?}");
    }
}

#[test]
fn greedy_prompts_and_generated_text() {
    let (t, g) = (tokenizer(), golden());
    for case in cases(&g, "greedy") {
        let prompt = case["prompt"].as_str().expect("prompt");
        assert_eq!(t.encode(prompt, true, true), ids(&case["prompt_ids"]), "prompt {prompt:?}");
        // Generated ids decode to llama.cpp's text; a final EOS is not part of the text.
        let mut generated = ids(&case["ids"]);
        if generated.last().is_some_and(|&id| t.is_eog(id)) {
            generated.pop();
        }
        let want = case["text"].as_str().expect("text");
        assert_eq!(t.decode(&generated, false), want);
        let mut stream = StreamDecoder::new(false);
        let mut text: String = generated.iter().map(|&id| stream.push(&t, id).to_owned()).collect();
        text.push_str(&stream.finish());
        assert_eq!(text, want, "streamed");
    }
}

#[test]
fn chat_prompt_token_counts() {
    let (t, g) = (tokenizer(), golden());
    for case in cases(&g, "chat") {
        let prompt = case["rendered_prompt"].as_str().expect("rendered_prompt");
        let n = case["prompt_tokens"].as_u64().expect("prompt_tokens") as usize;
        assert_eq!(t.encode(prompt, true, true).len(), n, "{prompt:?}");
    }
}

#[test]
fn rocket_split_across_byte_tokens_streams_whole() {
    let t = tokenizer();
    let ids = t.encode(" 🚀", false, true);
    assert_eq!(ids, [15107, 244, 218]);
    // 15107 is " " plus the rocket's first byte: the space goes out at once, the rest waits.
    let mut d = StreamDecoder::new(false);
    assert_eq!(d.push(&t, 15107), " ");
    assert_eq!(d.push(&t, 244), "");
    assert_eq!(d.push(&t, 218), "🚀");
    assert_eq!(d.finish(), "");
}

#[test]
fn twenty_kilobytes_tokenize_fast() {
    let (t, g) = (tokenizer(), golden());
    let ppl = &cases(&g, "perplexity")[0];
    let path = golden_dir().join(ppl["name"].as_str().expect("name"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    assert!(text.len() >= 19_000);
    t.encode(&text[..1000], false, true); // warm up
    let start = Instant::now();
    let ids = t.encode(&text, false, true);
    let elapsed = start.elapsed();
    eprintln!("{} bytes -> {} tokens in {elapsed:?}", text.len(), ids.len());
    // llama.cpp cut this file into `chunks` chunks of `ctx` tokens: that bounds the token count.
    let (ctx, chunks) = (ppl["ctx"].as_u64().unwrap() as usize, ppl["chunks"].as_u64().unwrap() as usize);
    assert!(ids.len() / ctx == chunks, "{} tokens do not make {chunks} chunks of {ctx}", ids.len());
    assert_eq!(t.decode(&ids, false), text);
    assert!(elapsed.as_millis() < 500, "tokenizing 20 KB took {elapsed:?}");
}
