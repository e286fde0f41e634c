//! The training half of the sweep: a fine-tuning run of the shape a job has (rank 8 on
//! all seven projections, 512-token batches) over synthetic examples of several lengths,
//! its batches and optimizer steps cut into units of 1 to all layers, each unit timed on a detached pool as
//! the engine's.

use std::time::Instant;

use blink_engine::serve::latency::Sample;
use blink_model::lora::LoraTarget;
use blink_model::Model;
use blink_train::data::Example;
use blink_train::jobs::{cost_of, Accepted, JobSettings};
use blink_train::optim::Decay;
use blink_train::run::{init, Finetune, FinetuneConfig, Outcome, Unit};

use crate::common::CliResult;

/// Example lengths (tokens), visited in turn.
const LENGTHS: [usize; 5] = [40, 96, 160, 250, 480];
/// Layers per forward or backward unit, one count per batch in turn.
const LAYERS: [usize; 5] = [1, 2, 5, 12, usize::MAX];

pub fn sweep(model: &Model, threads: usize, reps: usize, quick: bool, out: &mut Vec<Sample>) -> CliResult {
    let job = JobSettings::default();
    let n_examples = if quick { 10 } else { 12 * reps.max(1) };
    let examples: Vec<Example> = (0..n_examples)
        .map(|i| {
            let len = LENGTHS[i % LENGTHS.len()];
            let tokens = (0..len).map(|p| (blink_model::train::mix64((i as u64) << 32 | p as u64) % model.cfg.vocab_size as u64) as u32).collect();
            Example { line: i + 1, tokens, targets: (0..len).map(|p| p >= len / 2).collect() }
        })
        .collect();
    let cfg = FinetuneConfig {
        lr: 1e-4,
        epochs: 1,
        batch_tokens: job.batch_tokens,
        batch_examples: usize::MAX,
        accum: 1,
        warmup: 0,
        decay: Decay::Constant,
        weight_decay: 0.0,
        clip: Some(1.0),
        dropout: 0.0,
        seed: 1,
        checkpoint_every: None,
    };
    let params = init::fresh(&model.cfg, job.rank, job.alpha, &LoraTarget::ALL, 1);
    let mut run = Finetune::new(model, cfg, examples, Vec::new(), params, String::new())?;
    let pool = model.detached_pool(threads)?;
    let mut batch = 0;
    while let Some(unit) = run.next_unit()? {
        let k = LAYERS[batch % LAYERS.len()];
        let layers = match unit {
            Unit::Batch(shape) => k.min(shape.layers),
            Unit::GradNorm { layers, .. } | Unit::Optimizer { layers, .. } => k.min(layers),
        };
        let t = Instant::now();
        let outcome = run.run_unit(&pool, layers.max(1))?;
        let time = t.elapsed();
        // The first batch warms the buffers up.
        if batch > 0 {
            out.push(Sample::Unit { cost: cost_of(&Accepted { unit, layers }), time });
        }
        if let Outcome::Stepped(_) = outcome {
            batch += 1;
        }
    }
    Ok(())
}
