//! A step over a window of layers: chaining windows, each with its own KV cache holding
//! only its layers and hidden states handed from one to the next, gives logits
//! bit-identical to the whole pass, for prefill and decode, at several cut points, flat
//! and tensor parallel. Rows of every kind and with an adapter slot change nothing while
//! no adapter is loaded.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use blink_gguf::GgufFile;
use blink_runtime::numa::{NodePool, Topology};
use blink_model::lora::LoraMix;
use blink_model::{AdapterSlot, ForwardError, KvCache, KvType, Model, TensorPlacement, RowKind, Scratch, SeqId, Step, StepInput, StepOutput, StepRow};

const CTX: usize = 128;
const DECODE: usize = 6;

fn file() -> Arc<GgufFile> {
    Arc::new(GgufFile::open(blink_model::fetch::ensure_default_model().unwrap()).unwrap())
}

fn golden_prompt() -> Vec<u32> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/smollm2-135m-instruct-q4_1.json");
    let g: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    g["greedy"][0]["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn argmax(l: &[f32]) -> u32 {
    (0..l.len()).fold(0, |best, i| if l[i] > l[best] { i } else { best }) as u32
}

fn bits(l: &[f32]) -> Vec<u32> {
    l.iter().map(|v| v.to_bits()).collect()
}

/// The whole model's last-row logits after the prompt, then after each greedy token.
fn whole(model: &Model, pool: &NodePool, prompt: &[u32]) -> (Vec<Vec<u32>>, Vec<u32>) {
    let mut kv = model.new_kv_cache(CTX, KvType::F16);
    let mut scratch = Scratch::new(model, 64, 1, CTX, 2);
    let seq = kv.new_seq();
    let rows: Vec<StepRow> = prompt.iter().enumerate().map(|(p, &t)| StepRow::prompt(t, p, seq).with_logits(p + 1 == prompt.len())).collect();
    model.forward(pool, &mut kv, &rows, &mut scratch).unwrap();
    let (mut logits, mut tokens) = (vec![bits(scratch.logits(0))], Vec::new());
    for i in 0..DECODE {
        let t = argmax(scratch.logits(0));
        tokens.push(t);
        model.forward(pool, &mut kv, &[StepRow::decode(t, prompt.len() + i, seq)], &mut scratch).unwrap();
        logits.push(bits(scratch.logits(0)));
    }
    (logits, tokens)
}

/// One window of a chain: its layers, its own cache (of those layers only), scratch and
/// sequence.
struct Window {
    layers: Range<usize>,
    kv: KvCache,
    scratch: Scratch,
    seq: SeqId,
}

/// Run `tokens` (at positions from `start`) through the chain of windows; returns the
/// last row's logits.
fn chain_step(model: &Model, pool: &NodePool, windows: &mut [Window], tokens: &[u32], start: usize) -> Vec<u32> {
    let n_embd = model.cfg.n_embd;
    let last = windows.len() - 1;
    let mut hidden: Vec<f32> = Vec::new();
    for (i, w) in windows.iter_mut().enumerate() {
        let rows: Vec<StepRow> = tokens
            .iter()
            .enumerate()
            .map(|(j, &t)| {
                let row = if i == 0 { StepRow::prompt(t, start + j, w.seq) } else { StepRow::hidden(start + j, w.seq, RowKind::Prompt) };
                row.with_logits(j + 1 == tokens.len())
            })
            .collect();
        let input = if i == 0 { StepInput::Tokens } else { StepInput::Hidden(&hidden) };
        let output = if i == last { StepOutput::Logits } else { StepOutput::Hidden };
        let step = Step { rows: &rows, layers: w.layers.clone(), input, output, adapters: &[] };
        model.step(pool, &mut w.kv, &step, &mut w.scratch).unwrap();
        if i != last {
            hidden = (0..rows.len()).flat_map(|r| w.scratch.hidden(r).to_vec()).collect();
            assert_eq!(hidden.len(), rows.len() * n_embd);
        }
    }
    bits(windows[last].scratch.logits(0))
}

fn check_chains(model: &Model, pool: &NodePool, what: &str) {
    let prompt = golden_prompt();
    let (reference, tokens) = whole(model, pool, &prompt);
    let n = model.cfg.n_layers;
    for cuts in [vec![n / 2], vec![1, n - 1], vec![7, 19], vec![n - 1]] {
        let bounds: Vec<usize> = std::iter::once(0).chain(cuts.iter().copied()).chain(std::iter::once(n)).collect();
        let mut windows: Vec<Window> = bounds
            .windows(2)
            .map(|b| {
                let mut kv = model.try_new_kv_cache_for(b[0]..b[1], CTX, KvType::F16).unwrap();
                assert_eq!(kv.layouts().next().unwrap().layers(), b[0]..b[1]);
                let seq = kv.new_seq();
                Window { layers: b[0]..b[1], kv, scratch: Scratch::new(model, 64, 1, CTX, 2), seq }
            })
            .collect();
        let got = chain_step(model, pool, &mut windows, &prompt, 0);
        assert!(got == reference[0], "{what}, cuts {cuts:?}: prefill logits differ from the whole pass");
        for (i, &t) in tokens.iter().enumerate() {
            let got = chain_step(model, pool, &mut windows, &[t], prompt.len() + i);
            assert!(got == reference[i + 1], "{what}, cuts {cuts:?}: decode step {i} logits differ from the whole pass");
        }
    }
}

#[test]
fn chained_windows_match_the_whole_pass_bit_for_bit() {
    let model = Model::from_gguf(file()).unwrap();
    check_chains(&model, &model.pool(2).unwrap(), "flat");
}

#[test]
fn chained_windows_match_the_whole_pass_bit_for_bit_over_two_nodes() {
    let placement = TensorPlacement::tensor_parallel(Topology::simulated(2), 2);
    let model = Model::from_gguf_placed(file(), &placement).unwrap();
    check_chains(&model, &model.pool(2).unwrap(), "two simulated nodes");
}

#[test]
fn rows_of_every_kind_and_with_an_adapter_slot_change_nothing_without_adapters() {
    let model = Model::from_gguf(file()).unwrap();
    let pool = model.pool(2).unwrap();
    let prompt = golden_prompt();
    // Slots name mixes with no adapter in them: the rows run the base model.
    let empty: Vec<Arc<LoraMix>> = (0..5).map(|_| Arc::new(LoraMix::default())).collect();
    let run = |dress: &dyn Fn(usize, StepRow) -> StepRow| {
        let mut kv = model.new_kv_cache(CTX, KvType::F16);
        let mut scratch = Scratch::new(&model, 64, 64, CTX, 2);
        let seq = kv.new_seq();
        let rows: Vec<StepRow> = prompt.iter().enumerate().map(|(p, &t)| dress(p, StepRow::prompt(t, p, seq).with_logits(true))).collect();
        model.step(&pool, &mut kv, &Step::whole(&rows, model.cfg.n_layers).with_adapters(&empty), &mut scratch).unwrap();
        (0..rows.len()).map(|i| bits(scratch.logits(i))).collect::<Vec<_>>()
    };
    let plain = run(&|_, r| r);
    let kinds = [RowKind::Prompt, RowKind::Decode, RowKind::Training];
    let dressed = run(&|p, r| r.with_kind(kinds[p % 3]).with_adapter((p % 2 == 0).then_some(AdapterSlot(p as u16 % 5))));
    assert!(plain == dressed, "a row's kind or adapter slot changed its logits");

    // A slot past the step's mixes is refused before anything runs.
    let mut kv = model.new_kv_cache(CTX, KvType::F16);
    let mut scratch = Scratch::new(&model, 64, 64, CTX, 2);
    let seq = kv.new_seq();
    let rows = [StepRow::prompt(prompt[0], 0, seq), StepRow::prompt(prompt[1], 1, seq).with_adapter(Some(AdapterSlot(5)))];
    let err = model.step(&pool, &mut kv, &Step::whole(&rows, model.cfg.n_layers).with_adapters(&empty), &mut scratch).unwrap_err();
    assert_eq!(err, ForwardError::BadAdapterSlot { row: 1, slot: 5, adapters: 5 });
    assert_eq!(kv.seq_len(seq).unwrap(), 0, "a refused step grows nothing");
}

#[test]
fn a_step_outside_its_cache_window_or_with_bad_input_is_refused() {
    let model = Model::from_gguf(file()).unwrap();
    let pool = model.pool(1).unwrap();
    let n = model.cfg.n_layers;
    let mut kv = model.try_new_kv_cache_for(4..10, CTX, KvType::F16).unwrap();
    let mut scratch = Scratch::new(&model, 8, 1, CTX, 1);
    let seq = kv.new_seq();
    let rows = [StepRow::prompt(1, 0, seq)];
    let step = |layers: Range<usize>, input, output| Step { rows: &rows, layers, input, output, adapters: &[] };
    let err = model.step(&pool, &mut kv, &step(0..n, StepInput::Tokens, StepOutput::Logits), &mut scratch).unwrap_err();
    assert_eq!(err, ForwardError::WindowNotCached { step: 0..n, cache: 4..10 });
    let err = model.step(&pool, &mut kv, &step(4..n + 1, StepInput::Tokens, StepOutput::Hidden), &mut scratch).unwrap_err();
    assert_eq!(err, ForwardError::BadWindow { layers: 4..n + 1, n_layers: n });
    let short = vec![0f32; model.cfg.n_embd - 1];
    let err = model.step(&pool, &mut kv, &step(4..10, StepInput::Hidden(&short), StepOutput::Hidden), &mut scratch).unwrap_err();
    assert_eq!(err, ForwardError::BadHidden { got: short.len(), rows: 1, n_embd: model.cfg.n_embd });
    let tokenless = [StepRow::hidden(0, seq, RowKind::Prompt)];
    let err = model.step(&pool, &mut kv, &Step { rows: &tokenless, layers: 4..10, input: StepInput::Tokens, output: StepOutput::Hidden, adapters: &[] }, &mut scratch).unwrap_err();
    assert_eq!(err, ForwardError::MissingToken { row: 0 });
    assert!(model.try_new_kv_cache_for(3..n + 1, CTX, KvType::F16).is_err());
    // Nothing was reserved by the refused steps; a good one still runs.
    assert_eq!(kv.seq_len(seq).unwrap(), 0);
    model.step(&pool, &mut kv, &step(4..10, StepInput::Tokens, StepOutput::Hidden), &mut scratch).unwrap();
    assert_eq!(kv.seq_len(seq).unwrap(), 1);
}
