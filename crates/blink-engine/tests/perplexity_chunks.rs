//! Perplexity's chunks, as llama-perplexity cuts them: for a model that adds BOS, every
//! chunk starts with BOS in place of its first token, not only the first chunk.

mod support;

use blink_engine::perplexity::{perplexity, PerplexityConfig};
use blink_model::KvType;

#[test]
fn each_chunk_starts_with_bos_when_the_model_adds_one() {
    let (model, tok) = support::model();
    let text = "The river runs past the mill, under the old stone bridge and out to the sea. ".repeat(8);
    let tokens = tok.encode(&text, false, false);
    let ctx = 32;
    assert!(tokens.len() >= 3 * ctx, "{}", tokens.len());
    let cfg = |bos| PerplexityConfig { ctx, n_batch: 16, ubatch: 512, n_threads: 2, kv_type: KvType::F16, swa_full: false, max_chunks: Some(3), bos, adapter: None };
    let ppl = |tokens: &[u32], bos| perplexity(&model, tokens, &cfg(bos), &mut |_, _| {}).unwrap().ppl;

    let bos = tok.bos().unwrap_or(1);
    let mut with_bos = tokens.clone();
    for chunk in 0..3 {
        with_bos[chunk * ctx] = bos;
    }
    let replaced = ppl(&tokens, Some(bos));
    assert_eq!(replaced, ppl(&with_bos, None), "BOS should stand in for each chunk's first token");
    assert_ne!(replaced, ppl(&tokens, None), "the first tokens matter to the later ones' scores");
}
