//! The inference half of the sweep: passes of prompt chunks (lengths × depths already in
//! the cache), decode batches (sizes × contexts), mixes of both, and the same with
//! adapters, each timed on a detached pool as the engine runs them.

use std::sync::Arc;
use std::time::Instant;

use blink_engine::runner::{Runner, RunnerConfig};
use blink_engine::serve::latency::Sample;
use blink_engine::serve::StepCost;
use blink_model::lora::{LoraMix, LoraTarget, LoraTensors};

use crate::cmd::bench::lora;
use blink_model::{KvType, Model, SeqId, StepRow};

use crate::common::CliResult;

/// The cache's sequences, and how deep the sweep reaches into them.
const SEQS: usize = 16;
const MAX_DEPTH: usize = 768;
const MAX_CHUNK: usize = 256;

/// One shape: prompt chunks `(length, depth)` and decode rows at `context`.
struct Shape {
    chunks: &'static [(usize, usize)],
    decodes: usize,
    context: usize,
    adapters: usize,
}

pub fn sweep(model: &Model, threads: usize, reps: usize, quick: bool, out: &mut Vec<Sample>) -> CliResult {
    let cfg = RunnerConfig {
        threads,
        kv_tokens: SEQS * (MAX_DEPTH + MAX_CHUNK + 16),
        kv_type: KvType::F16,
        max_rows: MAX_CHUNK * 2 + SEQS,
        max_logit_rows: SEQS + 2,
        max_ctx: MAX_DEPTH + MAX_CHUNK + 16,
        // Sweeps rewind to a depth: the window before it must stay whole.
        swa_full: true,
        detached: true,
    };
    let mut runner = Runner::new(model, &cfg)?;
    let seqs: Vec<SeqId> = (0..SEQS).map(|_| runner.kv_mut().new_seq()).collect();
    let mixes: Vec<Arc<LoraMix>> = (0..2)
        .map(|i| {
            let t = LoraTensors::random(&model.cfg, 8, 16.0, &LoraTarget::ALL, 0.02, 77 + i);
            model.place_lora(&t).map(|a| Arc::new(LoraMix::single(Arc::new(a)))).map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    for shape in shapes(quick) {
        let adapters = &mixes[..shape.adapters];
        for rep in 0..=reps {
            let mut rows = Vec::new();
            let mut next = 0;
            for _ in 0..shape.decodes {
                let seq = seqs[next];
                next += 1;
                at_depth(&mut runner, seq, shape.context, model)?;
                rows.push(StepRow::decode(token(seq, shape.context, model), shape.context, seq).with_adapter(lora::slot(rows.len(), adapters)));
            }
            for &(len, depth) in shape.chunks {
                let seq = seqs[next];
                next += 1;
                at_depth(&mut runner, seq, depth, model)?;
                let slot = lora::slot(next, adapters);
                rows.extend((depth..depth + len).map(|p| StepRow::prompt(token(seq, p, model), p, seq).with_logits(p + 1 == depth + len).with_adapter(slot)));
            }
            let t = Instant::now();
            runner.run_with(&rows, adapters)?;
            let time = t.elapsed();
            if rep > 0 {
                out.push(Sample::Pass { cost: StepCost::of_rows(&rows, adapters.len()), time });
            }
        }
    }
    Ok(())
}

/// A random-looking token for sequence `seq` at position `p`.
fn token(seq: SeqId, p: usize, model: &Model) -> u32 {
    let h = blink_model::train::mix64(((seq as u64) << 32) | p as u64);
    (h % model.cfg.vocab_size as u64) as u32
}

/// Bring `seq` to exactly `depth` cached tokens: cut it back, or compute what it lacks.
fn at_depth(runner: &mut Runner<&Model>, seq: SeqId, depth: usize, model: &Model) -> CliResult {
    loop {
        let have = runner.kv().seq_len(seq)?;
        if have >= depth {
            runner.kv_mut().truncate(seq, depth)?;
            return Ok(());
        }
        let n = (depth - have).min(MAX_CHUNK);
        let rows: Vec<StepRow> = (have..have + n).map(|p| StepRow::prompt(token(seq, p, model), p, seq)).collect();
        runner.run(&rows)?;
    }
}

fn shapes(quick: bool) -> Vec<Shape> {
    let mut v = Vec::new();
    let chunk_sets: &[&'static [(usize, usize)]] = if quick {
        &[&[(16, 0)], &[(128, 0)], &[(64, 512)], &[(256, 0)]]
    } else {
        &[&[(8, 0)], &[(32, 0)], &[(64, 0)], &[(128, 0)], &[(256, 0)], &[(32, 256)], &[(128, 256)], &[(64, 512)], &[(256, 512)], &[(64, 0), (64, 256)], &[(16, 0), (128, 512)]]
    };
    for &chunks in chunk_sets {
        v.push(Shape { chunks, decodes: 0, context: 0, adapters: 0 });
    }
    let decode_sets: &[(usize, usize)] = if quick { &[(1, 64), (4, 512), (16, 256)] } else { &[(1, 32), (1, 512), (2, 256), (4, 64), (4, 768), (8, 256), (16, 32), (16, 512)] };
    for &(decodes, context) in decode_sets {
        v.push(Shape { chunks: &[], decodes, context, adapters: 0 });
    }
    let mixed: &[(usize, &'static [(usize, usize)])] = if quick { &[(4, &[(64, 0)])] } else { &[(2, &[(32, 0)]), (8, &[(128, 256)]), (12, &[(64, 0)])] };
    for &(decodes, chunks) in mixed {
        v.push(Shape { chunks, decodes, context: 256, adapters: 0 });
    }
    // Adapters: a decode batch and a prompt with one and two adapter mixes.
    for adapters in 1..=2 {
        v.push(Shape { chunks: &[], decodes: 4, context: 128, adapters });
        v.push(Shape { chunks: &[(64, 0)], decodes: 2, context: 128, adapters });
    }
    v
}
