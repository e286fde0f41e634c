//! `blink` against llama.cpp's golden outputs on the default model: the default path
//! against the build of llama.cpp whose results it reproduces on this CPU (AVX-512 or AVX2),
//! and each flavour of llama.cpp's definitions against its own build's outputs.

mod support;

use support::*;

#[test]
fn tokenize_matches_llama_cpp() {
    let model = model_path();
    let model = model.to_str().unwrap();
    for case in golden()["tokenize"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let out = blink(&["tokenize", "-m", model, "-p", text]);
        ok(&out);
        let ids: Vec<u64> = serde_json::from_str(stdout(&out).trim()).expect("a JSON array of ids");
        let want: Vec<u64> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(ids, want, "tokenize {text:?}");
    }
}

#[test]
fn prompts_from_a_file_or_stdin_tokenize_as_llama_cpp() {
    let model = model_path();
    let model = model.to_str().unwrap();
    let file = std::env::temp_dir().join(format!("blink-cli-golden-{}.txt", std::process::id()));
    for case in golden()["tokenize"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u64> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        // As llama.cpp's `-f`, one final newline is dropped.
        let input = format!("{text}\n");
        std::fs::write(&file, &input).unwrap();
        let from_file = blink(&["tokenize", "-m", model, "-f", file.to_str().unwrap()]);
        let from_stdin = blink_with_stdin(&["tokenize", "-m", model, "-f", "-"], input.as_bytes());
        for out in [from_file, from_stdin] {
            ok(&out);
            let ids: Vec<u64> = serde_json::from_str(stdout(&out).trim()).expect("a JSON array of ids");
            assert_eq!(ids, want, "tokenize {text:?}");
        }
    }
    let _ = std::fs::remove_file(&file);
}

#[test]
fn greedy_run_starts_with_the_owed_text() {
    greedy_runs_owe(&golden(), &[]);
}

/// `blink run --raw` with `extra` on each greedy case of `reference` starts with the text
/// it owes (llama.cpp's up to its first near-tie).
fn greedy_runs_owe(reference: &serde_json::Value, extra: &[&str]) {
    let model = model_path();
    let model = model.to_str().unwrap();
    for case in reference["greedy"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let owed = case["exact_text_owed"].as_str().unwrap();
        let mut args = vec!["run", "-m", model, "--raw", "--temp", "0", "-n", "32", "-t", THREADS, "-p", prompt];
        args.extend(extra);
        let out = blink(&args);
        ok(&out);
        let text = stdout(&out);
        assert!(
            text.starts_with(owed),
            "{extra:?} prompt {prompt:?}\n  owed: {owed:?}\n  got:  {text:?}"
        );
    }
}

/// Each flavour of llama.cpp's definitions gives its own build's text, on the x86 path of
/// that flavour (where this CPU has it) and on the scalar path told to take it: greedy
/// cases and chats.
#[test]
fn each_flavour_gives_its_builds_text() {
    for (flavour, extra) in flavour_runs() {
        let reference = reference("smollm2-135m-instruct-q4_1", flavour);
        greedy_runs_owe(&reference, &extra);
        chats_owe(&reference, &extra);
        let out = blink(&[&["info", "-m", model_path().to_str().unwrap()][..], &extra].concat());
        ok(&out);
        assert!(stdout(&out).contains(&format!("dot order:       llama, as {} computes", flavour.build())), "{extra:?}: {}", stdout(&out));
    }
}

/// `blink perplexity` on the golden text with `extra` arguments, and llama.cpp's figure.
fn perplexity(extra: &[&str]) -> (f64, f64) {
    let model = model_path();
    let g = golden();
    let case = &g["perplexity"][0];
    let file = repo_root().join("testdata/golden").join(case["name"].as_str().unwrap());
    let ctx = case["ctx"].as_u64().unwrap().to_string();
    let mut args = vec!["perplexity", "-m", model.to_str().unwrap(), "-f", file.to_str().unwrap(), "-c", &ctx, "-t", THREADS];
    args.extend_from_slice(extra);
    let out = blink(&args);
    ok(&out);
    let text = stdout(&out);
    let last = text.lines().last().expect("output");
    let ppl: f64 = last
        .split("PPL = ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no PPL in the last line: {last:?}"));
    (ppl, case["ppl"].as_f64().unwrap())
}

#[test]
fn perplexity_is_within_one_percent_of_llama_cpp() {
    let (ppl, want) = perplexity(&[]);
    let rel = (ppl - want).abs() / want;
    eprintln!("perplexity: blink {ppl:.4}, llama.cpp {want:.4}, relative difference {:.3}%", rel * 100.0);
    assert!(rel < 0.01, "PPL {ppl} vs llama.cpp {want}");
}

#[test]
fn perplexity_equals_llama_cpps_at_a_micro_batch_of_32() {
    perplexity_equals_llama_cpps_at_its_ubatch(&model_path(), "SmolLM2-135M-Instruct.Q4_1.gguf", (512, 32), 512);
}

/// Each flavour's perplexity is its own build's, chunk by chunk.
#[test]
fn each_flavours_perplexity_is_its_builds() {
    for (flavour, extra) in simd_flavour_runs() {
        perplexity_equals_builds_at_its_ubatch(&model_path(), "SmolLM2-135M-Instruct.Q4_1.gguf", (512, 32), 512, flavour, &extra);
    }
}

/// The block dot order gives up llama.cpp's bits, not its quality.
#[test]
fn block_dot_order_perplexity_is_within_one_percent_of_llama_cpp() {
    let (ppl, want) = perplexity(&["--dot-order", "block"]);
    let (llama_order, _) = perplexity(&[]);
    let rel = (ppl - want).abs() / want;
    eprintln!("perplexity, block dot order: blink {ppl:.4} (llama order {llama_order:.4}), llama.cpp {want:.4}, relative difference {:.3}%", rel * 100.0);
    assert!(rel < 0.01, "PPL {ppl} vs llama.cpp {want}");
    assert_ne!(ppl, llama_order, "--dot-order block changed nothing");
}

#[test]
fn info_describes_the_model() {
    let model = model_path();
    let out = blink(&["info", "-m", model.to_str().unwrap()]);
    ok(&out);
    let text = stdout(&out);
    for needle in ["architecture:    llama", "layers:          30", "Q4_1", "gpt2", "smollm", "heads:           9 query, 3 key/value", "cpu features:", "routes:          Q4_1: ", "Q8_0: "] {
        assert!(text.contains(needle), "info lacks {needle:?}:\n{text}");
    }
    // Activation panels sized from the L2 that the caches line reports (divided among the
    // CPUs sharing it): rows of 576 Q8_1 columns (648 bytes) that overflow it go in panels
    // of the most rows that fit in half of it, in twelves.
    let tiling = text.lines().find(|l| l.starts_with("tiling:")).unwrap_or_else(|| panic!("no tiling line:\n{text}"));
    let number_before = |line: &str, tail: &str| -> usize {
        let head = &line[..line.find(tail).unwrap_or_else(|| panic!("{tail:?} not in {line:?}"))];
        head.rsplit(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    let l2_kib = number_before(tiling, " KiB per core");
    if let Some(caches) = text.lines().find(|l| l.starts_with("caches:")) {
        let l2 = &caches[caches.find("L2 ").unwrap()..];
        let shared = number_before(l2, ")");
        assert_eq!(l2_kib, number_before(l2, " KiB") / shared, "{caches}\n{tiling}");
        // And the weight blocks from the L3 likewise.
        if let Some(at) = caches.find("L3 ") {
            let l3 = &caches[at..];
            let blocks = &tiling[tiling.find("half the L3").unwrap_or_else(|| panic!("{tiling}"))..];
            assert_eq!(number_before(blocks, " KiB per core"), number_before(l3, " KiB") / number_before(l3, ")"), "{caches}\n{tiling}");
        }
        // And the k-quants' weight chunks from the L1's data cache.
        if let Some(at) = caches.find("L1d ") {
            let l1 = &caches[at..];
            let chunks = &tiling[tiling.find("half the L1").unwrap_or_else(|| panic!("{tiling}"))..];
            assert_eq!(number_before(chunks, " KiB per core"), number_before(l1, " KiB") / number_before(l1, ")"), "{caches}\n{tiling}");
        }
    }
    // Past the rows of 576 columns that fill it, panels of the most rows that fit in half.
    assert_eq!(number_before(tiling, " rows of 576 columns"), l2_kib * 1024 / 648, "{tiling}");
    let at = tiling.find("rows of 576 columns").unwrap();
    let rows = number_before(&tiling[at..], ";");
    assert!(rows % 12 == 0 && rows * 648 <= l2_kib * 512 && (rows + 12) * 648 > l2_kib * 512, "{tiling}");
    // The routes of another path and order.
    let out = blink(&["info", "-m", model.to_str().unwrap(), "--kernel", "scalar", "--dot-order", "block"]);
    ok(&out);
    let text = stdout(&out);
    assert!(text.contains("kernel path:     scalar") && text.contains("dot order:       block") && text.contains("Q4_1: scalar reference"), "{text}");
}

#[test]
fn chat_template_run_matches_llama_cpp_server() {
    chats_owe(&golden(), &[]);
}

/// `blink run` with `extra` on each chat case of `reference` (its messages through the
/// model's template) starts with the text it owes.
fn chats_owe(reference: &serde_json::Value, extra: &[&str]) {
    let model = model_path();
    let model = model.to_str().unwrap();
    for case in reference["chat"].as_array().unwrap() {
        let messages = case["messages"].as_array().unwrap();
        let mut args = vec!["run", "-m", model, "--temp", "0", "-n", "32", "-t", THREADS];
        args.extend(extra);
        for m in messages {
            match m["role"].as_str().unwrap() {
                "system" => args.extend(["--system", m["content"].as_str().unwrap()]),
                "user" => args.extend(["-p", m["content"].as_str().unwrap()]),
                other => panic!("unexpected role {other}"),
            }
        }
        let out = blink(&args);
        ok(&out);
        let owed = case["exact_text_owed"].as_str().unwrap();
        assert!(stdout(&out).starts_with(owed), "{extra:?} messages {messages:?}\n  owed: {owed:?}\n  got:  {:?}", stdout(&out));
    }
}
