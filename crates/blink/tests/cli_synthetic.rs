//! `blink` against llama.cpp on the families without a small public model to hand:
//! the default model's weights under Granite, SmolLM3, OLMo 2, Gemma 2 and Phi-3
//! (`support::synthetic`, made as `scripts/llamacpp_ref/make_synthetic.py` made the
//! files of `testdata/golden/synthetic-<arch>.json`), and the default model quantized again
//! to the formats no public file of its size comes in. For each: llama.cpp's greedy text
//! (32 tokens, up to the first near-tie) on the same bytes, flat and over two simulated nodes, and its
//! perplexity: the mean log-likelihood per token within 0.5%.

mod support;

use std::path::Path;

use blink_gguf::GgmlType;
use support::synthetic::{requantized, synthetic};
use support::*;

fn reference(arch: &str) -> serde_json::Value {
    let path = repo_root().join(format!("testdata/golden/synthetic-{arch}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn gives_llama_cpps_text_and_perplexity(arch: &str) {
    check_against_llama_cpp(arch, &synthetic(arch));
}

fn check_against_llama_cpp(arch: &str, model: &Path) {
    if let Some(dir) = std::env::var_os("BLINK_KEEP_SYNTHETIC") {
        std::fs::copy(model, Path::new(&dir).join(format!("{arch}.gguf"))).unwrap();
    }
    let m = model.to_str().unwrap();
    let r = reference(arch);
    // The very file llama.cpp ran, byte for byte.
    let sha: String = blink_cluster::auth::file_sha256(model).unwrap().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(sha, r["model_sha256"].as_str().unwrap(), "{arch}: the file differs from the one llama.cpp ran");
    for case in r["greedy"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let owed = case["exact_text_owed"].as_str().unwrap();
        for extra in [&[][..], &["--numa-nodes", "2"][..]] {
            let mut args = vec!["run", "-m", m, "--raw", "--temp", "0", "-n", "32", "-t", THREADS, "-p", prompt];
            args.extend(extra);
            let out = blink(&args);
            ok(&out);
            assert!(stdout(&out).starts_with(owed), "{arch} {extra:?} prompt {prompt:?}\n  owed: {owed:?}\n  got:  {:?}", stdout(&out));
        }
    }
    let case = &r["perplexity"][0];
    let text = repo_root().join("testdata/golden").join(case["name"].as_str().unwrap());
    let out = blink(&["perplexity", "-m", m, "-f", text.to_str().unwrap(), "-c", "512", "-t", THREADS]);
    ok(&out);
    let ppl: f64 = stdout(&out).lines().last().and_then(|l| l.split("PPL = ").nth(1)).and_then(|s| s.split_whitespace().next()).and_then(|s| s.parse().ok()).expect("a PPL line");
    let want = case["ppl"].as_f64().unwrap();
    let nll_gap = (ppl.ln() - want.ln()).abs() / want.ln();
    eprintln!("{arch} perplexity: blink {ppl:.4}, llama.cpp {want:.4} (mean log-likelihood {:.3}% apart)", 100.0 * nll_gap);
    assert!(nll_gap < 0.005, "{arch}: PPL {ppl} vs llama.cpp {want}");
    let _ = std::fs::remove_file(model);
}

#[test]
fn granite_gives_llama_cpps_text_and_perplexity() {
    gives_llama_cpps_text_and_perplexity("granite");
}

#[test]
fn smollm3_gives_llama_cpps_text_and_perplexity() {
    gives_llama_cpps_text_and_perplexity("smollm3");
}

#[test]
fn olmo2_gives_llama_cpps_text_and_perplexity() {
    gives_llama_cpps_text_and_perplexity("olmo2");
}

#[test]
fn gemma2_gives_llama_cpps_text_and_perplexity() {
    gives_llama_cpps_text_and_perplexity("gemma2");
}

#[test]
fn phi3_gives_llama_cpps_text_and_perplexity() {
    gives_llama_cpps_text_and_perplexity("phi3");
}

#[test]
fn iq4_nl_and_iq4_xs_give_llama_cpps_text_and_perplexity() {
    // IQ4_XS where a row is whole super-blocks (the FFN's down projection), IQ4_NL elsewhere,
    // as llama-quantize falls back.
    let model = requantized("iq4", |_, cols| if cols.is_multiple_of(256) { GgmlType::IQ4_XS } else { GgmlType::IQ4_NL });
    check_against_llama_cpp("iq4", &model);
}

#[test]
fn q4_0_gives_llama_cpps_text_and_perplexity() {
    // llama.cpp's x86 build repacks Q4_0 and adds whole block sums: Blink's order for it.
    check_against_llama_cpp("q4_0", &requantized("q4_0", |_, _| GgmlType::Q4_0));
}

#[test]
fn mxfp4_gives_llama_cpps_text_and_perplexity() {
    // llama.cpp's x86 build repacks MXFP4 (as IQ4_NL) and adds whole block sums.
    check_against_llama_cpp("mxfp4", &requantized("mxfp4", |_, _| GgmlType::MXFP4));
}

#[test]
fn tq1_0_and_tq2_0_give_llama_cpps_text_and_perplexity() {
    // The last four layers' FFN down projections ternary (TQ1_0, TQ2_0 in turn), Q8_0
    // elsewhere: a trained model made ternary throughout says nothing but noise.
    let model = requantized("ternary", |name, _| {
        let layer = name.strip_prefix("blk.").and_then(|s| s.split('.').next()).and_then(|l| l.parse::<usize>().ok());
        match layer {
            Some(l) if l >= 26 && name.ends_with("ffn_down.weight") => [GgmlType::TQ1_0, GgmlType::TQ2_0][l % 2],
            _ => GgmlType::Q8_0,
        }
    });
    check_against_llama_cpp("ternary", &model);
}

#[test]
fn iq2_and_iq3_formats_give_llama_cpps_text_and_perplexity() {
    // The last ten layers' FFN down projections in IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and
    // IQ3_S, two layers each, Q8_0 elsewhere.
    let model = requantized("lattice", |name, _| {
        use GgmlType::*;
        let layer = name.strip_prefix("blk.").and_then(|s| s.split('.').next()).and_then(|l| l.parse::<usize>().ok());
        match layer {
            Some(l) if l >= 20 && name.ends_with("ffn_down.weight") => [IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S][(l - 20) / 2],
            _ => Q8_0,
        }
    });
    check_against_llama_cpp("lattice", &model);
}

#[test]
fn qwen3moe_gives_llama_cpps_text_and_perplexity() {
    gives_llama_cpps_text_and_perplexity("qwen3moe");
}

#[test]
fn mixtral_gives_llama_cpps_text_and_perplexity() {
    gives_llama_cpps_text_and_perplexity("mixtral");
}
