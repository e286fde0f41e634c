//! Unit tests on small hand-made vocabularies (the real vocabularies are tested in
//! `tests/tokenizer_vocabs.rs` and `tests/tokenizer_golden.rs`).

use super::bpe::byte_char;
use super::*;

/// The 256 byte characters (ids 0..=255), then `extra` tokens (ids 256..) with their types.
fn bpe_parts(pre: &str, extra: &[(&str, i32)], merges: &[&str]) -> TokenizerParts {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut types = vec![1; 256];
    for &(t, ty) in extra {
        tokens.push(t.to_owned());
        types.push(ty);
    }
    TokenizerParts {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: Some(types),
        merges: Some(merges.iter().map(|m| m.to_string()).collect()),
        ..Default::default()
    }
}

fn byte_id(b: u8) -> u32 {
    u32::from(b)
}

fn bytes_ids(s: &str) -> Vec<u32> {
    s.bytes().map(byte_id).collect()
}

/// Vocabulary: bytes, "he" 256, "ll" 257, "hell" 258, "hello" 259, "Ġw" 260, "<|im_start|>" 261
/// (control), "<|im_end|>" 262 (control), "<tool>" 263 (user-defined).
fn small_bpe(pre: &str) -> Tokenizer {
    let extra = [
        ("he", 1),
        ("ll", 1),
        ("hell", 1),
        ("hello", 1),
        ("Ġw", 1),
        ("<|im_start|>", 3),
        ("<|im_end|>", 3),
        ("<tool>", 4),
    ];
    let merges = ["l l", "h e", "he ll", "hell o", "Ġ w"];
    let mut parts = bpe_parts(pre, &extra, &merges);
    parts.special.bos = Some(261);
    parts.special.eos = Some(262);
    Tokenizer::from_parts(parts).expect("small BPE vocabulary")
}

#[test]
fn bpe_merges_by_rank() {
    let t = small_bpe("gpt-2");
    assert_eq!(t.encode("hello", false, false), [259]);
    // "hel": "h e" applies, "ll" cannot form.
    assert_eq!(t.encode("hel", false, false), [256, byte_id(b'l')]);
    // " w" is one word; "Ġw" forms.
    assert_eq!(t.encode("hello wow", false, false), [259, 260, byte_id(b'o'), byte_id(b'w')]);
}

#[test]
fn bpe_ignore_merges_takes_whole_word_tokens() {
    // "hello" is a token; Llama 3 style emits it directly even without a merge path.
    let extra = [("hello", 1)];
    let parts = bpe_parts("llama-bpe", &extra, &[]);
    let t = Tokenizer::from_parts(parts).unwrap();
    assert_eq!(t.encode("hello", false, false), [256]);
    let parts = bpe_parts("gpt-2", &extra, &[]);
    let t = Tokenizer::from_parts(parts).unwrap();
    assert_eq!(t.encode("hello", false, false), bytes_ids("hello"));
}

#[test]
fn special_tokens_parsed_only_when_asked() {
    let t = small_bpe("gpt-2");
    let text = "<|im_start|>hello<|im_end|>";
    assert_eq!(t.encode(text, false, true), [261, 259, 262]);
    let plain = t.encode(text, false, false);
    assert!(!plain.contains(&261) && !plain.contains(&262), "{plain:?}");
    assert_eq!(t.decode(&plain, false), text);
    // User-defined tokens are always split out.
    assert_eq!(t.encode("<tool>hello", false, false), [263, 259]);
}

#[test]
fn add_special_follows_metadata() {
    let t = small_bpe("gpt-2");
    // BPE default: no BOS (gpt-2 pre-tokenizer), unless the metadata says so.
    assert!(!t.add_bos());
    assert_eq!(t.encode("hello", true, false), [259]);
    let mut parts = bpe_parts("gpt-2", &[("<s>", 3), ("</s>", 3)], &[]);
    parts.special.bos = Some(256);
    parts.special.eos = Some(257);
    parts.add_bos = Some(true);
    parts.add_eos = Some(true);
    let t = Tokenizer::from_parts(parts).unwrap();
    assert!(t.add_bos() && t.add_eos());
    assert_eq!(t.encode("a", true, false), [256, byte_id(b'a'), 257]);
    assert_eq!(t.encode("", true, false), [256, 257]);
    assert_eq!(t.encode("", false, false), Vec::<u32>::new());
    // Llama 3's pre-tokenizer defaults add_bos to true.
    let mut parts = bpe_parts("llama-bpe", &[("<|begin_of_text|>", 3)], &[]);
    parts.special.bos = Some(256);
    let t = Tokenizer::from_parts(parts).unwrap();
    assert_eq!(t.encode("a", true, false), [256, byte_id(b'a')]);
}

#[test]
fn end_of_generation_tokens_are_recognised_by_text() {
    let t = small_bpe("gpt-2");
    assert!(t.is_eog(262)); // eos, and "<|im_end|>" by text
    assert!(!t.is_eog(261));
    assert!(t.is_control(261));
    assert_eq!(t.eot(), Some(262));
    let mut parts = bpe_parts("gpt-2", &[("<|endoftext|>", 1), ("<|eot_id|>", 1)], &[]);
    parts.special.eos = Some(256);
    let t = Tokenizer::from_parts(parts).unwrap();
    assert!(t.is_eog(256) && t.is_eog(257));
    // Marked as control even though typed normal, as llama.cpp does.
    assert!(t.is_control(257));
    assert_eq!(t.eog_ids(), [256, 257]);
    // Of several end-of-turn candidates, the turn marker is preferred over end-of-text.
    assert_eq!(t.eot(), Some(257));
}

#[test]
fn invalid_ids_never_panic() {
    let t = small_bpe("gpt-2");
    for id in [t.vocab_size() as u32, u32::MAX] {
        assert_eq!(t.token_text(id), None);
        assert_eq!(&*t.token_bytes(id, true), "\u{FFFD}".as_bytes());
        assert!(!t.is_eog(id));
        assert!(!t.is_control(id));
    }
    assert_eq!(t.decode(&[259, u32::MAX, 259], false), "hello\u{FFFD}hello");
    let mut d = StreamDecoder::new(false);
    assert_eq!(d.push(&t, u32::MAX), "\u{FFFD}");
}

#[test]
fn control_tokens_render_only_when_asked() {
    let t = small_bpe("gpt-2");
    assert_eq!(t.decode(&[261, 259, 262], false), "hello");
    assert_eq!(t.decode(&[261, 259, 262], true), "<|im_start|>hello<|im_end|>");
    assert_eq!(&*t.token_bytes(263, false), b"<tool>");
    assert_eq!(t.token_id("<|im_end|>"), Some(262));
    assert_eq!(t.token_text(260), Some("Ġw"));
}

#[test]
fn stream_decoder_holds_split_characters() {
    let t = small_bpe("gpt-2");
    let ids = t.encode("a🚀b", false, false);
    assert_eq!(ids, bytes_ids("a🚀b"));
    let mut d = StreamDecoder::new(false);
    let pieces: Vec<String> = ids.iter().map(|&id| d.push(&t, id).to_owned()).collect();
    assert_eq!(pieces, ["a", "", "", "", "🚀", "b"]);
    assert_eq!(d.finish(), "");
    // An unfinished character is flushed lossily.
    let mut d = StreamDecoder::new(false);
    assert_eq!(d.push(&t, 0xF0), "");
    assert_eq!(d.pending_len(), 1);
    assert_eq!(d.finish(), "\u{FFFD}");
    // A byte that cannot start or continue a character is replaced at once.
    assert_eq!(d.push(&t, 0xFF), "\u{FFFD}");
    assert_eq!(d.push(&t, u32::from(b'x')), "x");
}

#[test]
fn empty_and_whitespace_text() {
    let t = small_bpe("gpt-2");
    assert!(t.encode("", false, true).is_empty());
    assert_eq!(t.encode("  ", false, true), bytes_ids("  "));
    assert_eq!(t.decode(&[], true), "");
}

#[test]
fn decode_cleans_spaces_only_where_llama_cpp_does() {
    let text = "hello , wow !";
    // gpt-2 cleans spaces before punctuation; smollm does not.
    let t = small_bpe("gpt-2");
    assert_eq!(t.decode(&t.encode(text, false, false), false), "hello, wow!");
    let t = small_bpe("smollm");
    assert_eq!(t.decode(&t.encode(text, false, false), false), text);
}

/// SentencePiece: `<unk>`, `<s>`, `</s>`, 256 byte tokens, then pieces with scores.
fn small_spm(add_space_prefix: Option<bool>) -> Tokenizer {
    let mut tokens = vec!["<unk>".to_owned(), "<s>".to_owned(), "</s>".to_owned()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (t, s) in [("▁", -1.0), ("h", -2.0), ("i", -2.0), ("▁h", -3.0), ("hi", -1.5), ("▁hi", -0.5)] {
        tokens.push(t.to_owned());
        types.push(1);
        scores.push(s);
    }
    let parts = TokenizerParts {
        model: "llama".into(),
        tokens,
        token_types: Some(types),
        scores: Some(scores),
        add_space_prefix,
        ..Default::default()
    };
    Tokenizer::from_parts(parts).unwrap()
}

#[test]
fn spm_merges_by_score_with_space_prefix_and_byte_fallback() {
    let t = small_spm(None);
    let (sp, h, i, sp_hi) = (259, 260, 261, 264);
    assert_eq!(t.token_text(sp_hi), Some("▁hi"));
    // Defaults: BOS 1 added, space prefix on.
    assert!(t.add_bos());
    assert_eq!(t.encode("hi", true, false), [1, sp_hi]);
    assert_eq!(t.encode("hi hi", false, false), [sp_hi, sp_hi]);
    // "é" has no piece: its UTF-8 bytes C3 A9 fall back to <0xC3><0xA9>.
    assert_eq!(t.encode("é", false, false), [sp, 3 + 0xC3, 3 + 0xA9]);
    assert_eq!(t.decode(&t.encode("hé hi", false, false), false), "hé hi");
    // The first token's space is dropped only when no BOS precedes it.
    assert_eq!(t.decode(&[1, sp_hi], false), " hi");
    assert_eq!(t.decode(&[sp_hi, sp_hi], false), "hi hi");
    let t = small_spm(Some(false));
    assert_eq!(t.encode("hi", false, false), [262 + 1]);
    assert_eq!(t.encode("ih", false, false), [i, h]);
}

#[test]
fn spm_special_tokens_restart_the_space_prefix() {
    let t = small_spm(None);
    assert_eq!(t.encode("hi</s>hi", false, true), [264, 2, 264]);
    assert_eq!(t.decode(&[264, 2, 264], true), "hi</s> hi");
    // "<unk>" is an unknown-type token: parsed only with parse_special.
    assert_eq!(t.encode("<unk>", false, true), [0]);
    assert_ne!(t.encode("<unk>", false, false), [0]);
}

fn error_of(parts: TokenizerParts) -> String {
    match Tokenizer::from_parts(parts) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn malformed_parts_give_clear_errors() {
    let mut p = bpe_parts("gpt-2", &[], &[]);
    p.model = "bert".into();
    assert!(error_of(p).contains("unsupported tokenizer model \"bert\""));

    let p = bpe_parts("gpt-4o", &[], &[]);
    assert!(error_of(p).contains("unsupported pre-tokenizer \"gpt-4o\""));

    let mut p = bpe_parts("gpt-2", &[], &[]);
    p.token_types = Some(vec![1; 3]);
    assert!(error_of(p).contains("tokenizer.ggml.token_type: has 3 entries but tokenizer.ggml.tokens has 256"));

    let p = bpe_parts("gpt-2", &[], &["hello"]);
    assert!(error_of(p).contains("merge #0 \"hello\""));

    let mut p = bpe_parts("gpt-2", &[], &[]);
    p.merges = None;
    assert!(error_of(p).contains("missing tokenizer.ggml.merges"));

    let mut p = bpe_parts("gpt-2", &[], &[]);
    p.special.eos = Some(256);
    assert!(error_of(p).contains("tokenizer.ggml.eos_token_id: token id 256 is out of range"));

    let mut p = bpe_parts("gpt-2", &[], &[]);
    p.tokens.clear();
    p.token_types = None;
    assert!(error_of(p).contains("token list is empty"));

    let mut p = bpe_parts("gpt-2", &[], &[]);
    p.scores = Some(vec![0.0]);
    assert!(error_of(p).contains("tokenizer.ggml.scores"));
}

#[test]
fn unusual_input_is_handled() {
    let t = small_bpe("llama-bpe");
    let text = "\u{0}\u{FEFF}\u{10FFFF}\r\n\t \u{3000}x\u{897}";
    let ids = t.encode(text, true, true);
    assert_eq!(ids[0], 261, "llama-bpe adds BOS by default");
    assert_eq!(t.decode(&ids, false), text);
    let long = "ab ".repeat(10_000);
    assert_eq!(t.decode(&t.encode(&long, false, false), false), long);
}

#[test]
fn tokenizer_is_shareable_and_debug_is_short() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Tokenizer>();
    shareable::<StreamDecoder>();
    let t = small_bpe("gpt-2");
    let dbg = format!("{t:?}");
    assert!(dbg.contains("vocab_size: 264") && dbg.len() < 300, "{dbg}");
}
