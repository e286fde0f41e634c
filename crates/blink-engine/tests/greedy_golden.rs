//! Greedy generation against llama.cpp's token ids, at the library level, reporting how far
//! past the owed prefix the two engines keep agreeing.

use std::path::Path;

use blink_engine::{GenerateParams, SamplingParams, Session, SessionConfig};
use blink_model::{KvType, Model};
use blink_text::tokenizer::Tokenizer;

fn golden() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/smollm2-135m-instruct-q4_1.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn greedy_ids_match_llama_cpp() {
    let path = blink_model::fetch::ensure_default_model().unwrap();
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let cfg = SessionConfig { n_ctx: 256, n_threads: 2, n_batch: 64, kv_type: KvType::F16, swa_full: false };
    let mut report = Vec::new();
    for case in golden()["greedy"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        assert_eq!(tok.encode(case["prompt"].as_str().unwrap(), true, true), prompt);
        let want = ids(&case["ids"]);
        let owed = case["exact_tokens_owed"].as_u64().unwrap() as usize;
        let mut session = Session::new(&model, &cfg).unwrap();
        let params = GenerateParams { max_tokens: Some(want.len()), sampling: SamplingParams::greedy(), ..Default::default() };
        let g = session.generate(&tok, &prompt, &params, &mut |_| {}).unwrap();
        // llama.cpp's ids end with EOS when it stopped there; ours leave it out.
        let mut got = g.tokens.clone();
        if g.finish == blink_engine::FinishReason::Stop && want.last() == tok.eos().as_ref() {
            got.push(tok.eos().unwrap());
        }
        let agree = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        report.push(format!("{:?}: {agree}/{} tokens agree (owed {owed})", case["prompt"].as_str().unwrap(), want.len()));
        assert!(agree >= owed, "prompt {:?}: only {agree} tokens agree, {owed} owed\n got  {got:?}\n want {want:?}", case["prompt"]);
    }
    eprintln!("{}", report.join("\n"));
}
