//! Pre-tokenization of byte-level BPE models: splitting text into words before merging.
//!
//! `tokenizer.ggml.pre` selects a list of regexes, applied as successive stages in llama.cpp's
//! manner: each stage splits every current piece into its matches *and* the text between them, and
//! regexes only ever see one piece at a time (so `$` and `(?!\S)` stop at a piece's end). Smollm, for
//! example, first isolates each digit with `\p{N}`, then applies the GPT-2 pattern to the rest.
//!
//! Character classes follow llama.cpp's Unicode tables, which are Unicode 15.1; the regex engine's
//! tables are newer, so every `\p{..}` is intersected with `\p{Age=15.1}` (checked exhaustively against
//! llama.cpp's table: identical for L, N, P, S, M and `\s`). llama.cpp matches regexes without Unicode
//! classes on text whose non-ASCII whitespace became U+000B, so such classes spelled with non-ASCII
//! ranges here exclude `\s` to match that.

use std::ops::Range;

use fancy_regex::Regex;

use super::TokenizerError;

/// GPT-2's pattern; llama.cpp's hand-written splitter for it behaves as if `|\s+` ended it.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// The contractions of Llama 3 and Qwen, case-insensitive.
macro_rules! contractions {
    () => {
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    };
}
/// Llama 3's whitespace alternatives, shared with Qwen.
macro_rules! ws_tail {
    () => {
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    };
}
const LLAMA3: &str =
    concat!(contractions!(), r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*", ws_tail!());
const QWEN2: &str =
    concat!(contractions!(), r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*", ws_tail!());
const QWEN35: &str = concat!(
    contractions!(),
    r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*",
    ws_tail!()
);
const DIGIT: &str = r"\p{N}";
const DIGITS: &str = r"\p{N}+";
const ASCII_TRIPLE: &str = "[0-9][0-9][0-9]";
const NEWLINE: &str = "[\r\n]";
/// CJK ideographs, a wide range below them (minus whitespace, see the module doc) and Hangul.
const CJK: &str = "[[\u{4E00}-\u{9FA5}\u{0800}-\u{4E00}\u{AC00}-\u{D7FF}]--\\s]+";
/// DeepSeek LLM's letter ranges (from its tokenizer.json), as a macro so that `concat!` can use it.
macro_rules! deepseek_letters {
    () => {
        concat!(
            "A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}",
            "\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-",
            "\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-",
            "\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-",
            "\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}",
            "-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}",
            "\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}",
            "-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}",
            "\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}",
            "\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-",
            "\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}",
            "\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}",
            "\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-",
            "\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}",
            "\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}",
        )
    };
}
/// A DeepSeek LLM word: an optional space, then its letters.
const DEEPSEEK_WORD: &str = concat!("\\s?[", deepseek_letters!(), "]+");
/// DeepSeek LLM's punctuation: ASCII and fullwidth punctuation, quotes, CJK marks (U+3000 is a space).
const DEEPSEEK_PUNCT: &str =
    "\\s?[[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]--\\s]+";

/// The regex stages of one pre-tokenizer family, and the flags llama.cpp sets with it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PreConfig {
    stages: &'static [&'static str],
    /// A word that is itself a token is emitted whole, skipping the merges (Llama 3).
    pub ignore_merges: bool,
    /// Default of `add_bos` when the metadata does not say.
    pub add_bos: bool,
    /// Whether detokenization tidies spaces before punctuation (llama.cpp's `clean_spaces`).
    pub clean_spaces: bool,
}

const fn cfg(stages: &'static [&'static str], clean_spaces: bool) -> PreConfig {
    PreConfig { stages, ignore_merges: false, add_bos: false, clean_spaces }
}

/// Every `tokenizer.ggml.pre` value Blink accepts (for error messages and docs).
pub const SUPPORTED_PRE: &[&str] = &[
    "default", "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
    "lfm2", "dbrx", "smaug-bpe", "qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "qwen35",
    "gpt-2", "phi-2", "mpt", "olmo", "exaone4", "starcoder", "refact", "codeshell", "exaone",
    "minerva-7b", "command-r", "smollm", "falcon", "deepseek-llm", "deepseek-coder",
];

/// The configuration for `pre` (`None` = key absent, which llama.cpp treats as `"default"`).
pub(crate) fn config_for(pre: Option<&str>) -> Result<PreConfig, TokenizerError> {
    const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, DIGITS, ASCII_TRIPLE];
    const DIGITS_THEN_GPT2: &[&str] = &[DIGIT, GPT2];
    let c = match pre.unwrap_or("default") {
        "default" => cfg(DEFAULT, true),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => {
            PreConfig { stages: &[LLAMA3], ignore_merges: true, add_bos: true, clean_spaces: true }
        }
        "dbrx" | "smaug-bpe" => cfg(&[LLAMA3], true),
        "qwen2" | "deepseek-r1-qwen" => cfg(&[QWEN2], false),
        "megrez" | "stablelm2" => cfg(&[QWEN2], true),
        "qwen35" => cfg(&[QWEN35], false),
        "gpt-2" | "phi-2" | "mpt" | "olmo" | "exaone4" => cfg(&[GPT2], true),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" => cfg(DIGITS_THEN_GPT2, true),
        "command-r" | "smollm" => cfg(DIGITS_THEN_GPT2, false),
        "falcon" => cfg(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, ASCII_TRIPLE], true),
        "deepseek-llm" => cfg(&[NEWLINE, DEEPSEEK_WORD, DEEPSEEK_PUNCT, r"\s+$", CJK, DIGITS], false),
        "deepseek-coder" => cfg(&[NEWLINE, r"\s?\p{L}+", r"\s?\p{P}+", CJK, DIGIT], false),
        other => return Err(TokenizerError::UnsupportedPre(other.to_owned())),
    };
    Ok(c)
}

/// Compiled stages of a pre-tokenizer.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    stages: Vec<Regex>,
}

impl PreTokenizer {
    pub fn new(config: &PreConfig) -> Result<PreTokenizer, TokenizerError> {
        let mut stages = Vec::with_capacity(config.stages.len());
        for &pattern in config.stages {
            let source = pin_unicode_version(pattern);
            let re = fancy_regex::RegexBuilder::new(&source)
                .backtrack_limit(usize::MAX / 2)
                .build()
                .map_err(|e| TokenizerError::invalid("tokenizer.ggml.pre", format!("pattern failed to compile: {e}")))?;
            stages.push(re);
        }
        Ok(PreTokenizer { stages })
    }

    /// Splits `text` into words (byte ranges, in order, covering all of `text`).
    pub fn split(&self, text: &str) -> Vec<Range<usize>> {
        let mut pieces: Vec<Range<usize>> = Vec::with_capacity(text.len() / 4 + 1);
        pieces.push(0..text.len());
        let mut next = Vec::new();
        for re in &self.stages {
            next.clear();
            for piece in &pieces {
                split_piece(re, text, piece.clone(), &mut next);
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        pieces.retain(|r| !r.is_empty());
        pieces
    }
}

/// Appends the matches of `re` within `text[piece]` and the gaps between them to `out`.
fn split_piece(re: &Regex, text: &str, piece: Range<usize>, out: &mut Vec<Range<usize>>) {
    let base = piece.start;
    let s = &text[piece];
    let mut last = 0;
    for m in re.find_iter(s) {
        // A matching error (only a backtracking limit, unreachable with these patterns) leaves the
        // remainder of the piece unsplit rather than failing.
        let Ok(m) = m else { break };
        if m.start() > last {
            out.push(base + last..base + m.start());
        }
        if m.end() > m.start() {
            out.push(base + m.start()..base + m.end());
        }
        last = m.end();
    }
    if last < s.len() {
        out.push(base + last..base + s.len());
    }
}

/// Rewrites each `\p{L}`, `\p{N}`, `\p{P}`, `\p{S}`, `\p{M}` as its Unicode 15.1 subset.
fn pin_unicode_version(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() * 2);
    let mut rest = pattern;
    while let Some(pos) = rest.find("\\p{") {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 3..];
        match after.find('}') {
            Some(end) if matches!(&after[..end], "L" | "N" | "P" | "S" | "M") => {
                out.push_str("[\\p{");
                out.push_str(&after[..end]);
                out.push_str("}&&\\p{Age=15.1}]");
                rest = &after[end + 1..];
            }
            _ => {
                out.push_str("\\p{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::new(&config_for(Some(pre)).unwrap()).unwrap();
        p.split(text).into_iter().map(|r| text[r].to_owned()).collect()
    }

    #[test]
    fn smollm_isolates_digits_before_gpt2() {
        assert_eq!(words("smollm", "abc 123"), ["abc", " ", "1", "2", "3"]);
        assert_eq!(words("smollm", "Hello, world!"), ["Hello", ",", " world", "!"]);
    }

    #[test]
    fn llama3_groups_three_digits_and_newlines() {
        assert_eq!(words("llama-bpe", "12345"), ["123", "45"]);
        assert_eq!(words("llama-bpe", "a  \n\nb"), ["a", "  \n\n", "b"]);
        assert_eq!(words("llama-bpe", "I'M"), ["I", "'M"]);
    }

    #[test]
    fn whitespace_before_a_word_leaves_one_space_for_it() {
        assert_eq!(words("gpt-2", "a   b"), ["a", "  ", " b"]);
        assert_eq!(words("gpt-2", "a   "), ["a", "   "]);
    }

    #[test]
    fn unicode_classes_are_pinned() {
        assert_eq!(pin_unicode_version(r"[^\s\p{L}]\p{Han}"), r"[^\s[\p{L}&&\p{Age=15.1}]]\p{Han}");
        // U+0897 became a mark in Unicode 16; for llama.cpp it is unassigned, hence "other".
        assert_eq!(words("qwen35", "a\u{897}"), ["a", "\u{897}"]);
    }

    #[test]
    fn assembled_patterns_are_llama_cpp_s() {
        assert_eq!(
            LLAMA3,
            concat!(
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            )
        );
        assert!(QWEN2.contains(r"\p{L}+|\p{N}| ?") && QWEN35.contains(r"?[\p{L}\p{M}]+|\p{N}|"));
    }

    #[test]
    fn unknown_pre_is_refused() {
        let err = config_for(Some("no-such-pre")).unwrap_err().to_string();
        assert!(err.contains("unsupported pre-tokenizer \"no-such-pre\""), "{err}");
    }
}
