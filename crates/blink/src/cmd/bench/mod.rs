//! `blink bench`: prompt-processing and generation speed, in the manner of llama-bench.
//!
//! `pp<N>` evaluates an N-token prompt in one step from an empty cache; `tg<N>` generates N
//! tokens one step at a time; with `--batch B`, `tg<N>` runs B sequences side by side and
//! reports their aggregate speed. With `-d D` (`pp<N> @ d<D>`), every sequence's cache
//! already holds D tokens when the timed part starts. Each test is repeated `-r` times after
//! one warm-up, and reported as mean ± standard deviation. `--bandwidth` also measures
//! memory bandwidth with a STREAM-style triad and relates decode speed to the bound it
//! implies. `--lora N` adds, after each base row, the same test with its sequences spread
//! over N random adapters (see [`lora`]), measured in turn with the base row's
//! repetitions so a noisy machine's drift touches both alike.

pub(crate) mod lora;
mod ring;

use std::sync::Arc;
use std::time::Instant;

use blink_engine::rng::Rng;
use blink_engine::{Runner, RunnerConfig};
use blink_model::kv_cache::{KvCache, SeqId, BLOCK_TOKENS};
use blink_model::lora::LoraMix;
use blink_model::{KvType, Model, StepRow};
use serde::Serialize;

use self::lora::Adapters;

use crate::common::{load_model_placed, resolve_threads, CliResult, KernelArgs, ModelArgs, NumaArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt lengths to test (comma-separated; 0 skips).
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512")]
    n_prompt: Vec<usize>,
    /// Generation lengths to test (comma-separated; 0 skips).
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128")]
    n_gen: Vec<usize>,
    /// Context depths: tokens already in each sequence's cache when a test starts
    /// (comma-separated; llama-bench's `-d`).
    #[arg(short = 'd', long = "n-depth", value_delimiter = ',', default_value = "0")]
    depth: Vec<usize>,
    /// Thread counts to test (comma-separated; default: all CPUs).
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Parallel sequences for generation tests (comma-separated; aggregate speed).
    #[arg(long = "batch", value_delimiter = ',', default_value = "1")]
    batch: Vec<usize>,
    /// KV cache element type: f16 or f32.
    #[arg(long = "cache-type", default_value = "f16", value_parser = crate::common::parse_kv_type)]
    cache_type: KvType,
    /// Print one JSON array instead of a table.
    #[arg(long)]
    json: bool,
    /// Also measure memory bandwidth (a STREAM triad) and the decode bound it implies.
    #[arg(long)]
    bandwidth: bool,
    /// Also run each test with its sequences spread over this many random LoRA adapters
    /// (sequence i on adapter i mod N; a prompt on one adapter); 0: base model only.
    #[arg(long = "lora", value_name = "N", default_value_t = 0)]
    lora: usize,
    /// Rank of the `--lora` adapters (on all seven projections of every layer).
    #[arg(long = "lora-rank", value_name = "R", default_value_t = 8)]
    lora_rank: usize,
    #[command(flatten)]
    kernel: KernelArgs,
    #[command(flatten)]
    numa: NumaArgs,
    #[command(flatten)]
    ring: crate::cmd::cluster::RingArgs,
    /// With --cluster: micro-batches of a generation test's sequences kept going round the
    /// ring at once (comma-separated).
    #[arg(long = "in-flight", value_delimiter = ',', default_value = "1")]
    in_flight: Vec<usize>,
}

/// One result row.
#[derive(Serialize)]
struct Row {
    model: String,
    file_type: String,
    kernel: String,
    dot_order: String,
    test: String,
    depth: usize,
    threads: usize,
    batch: usize,
    /// Adapters the sequences are spread over (0: the base model).
    loras: usize,
    /// Their rank (0 for the base model).
    lora_rank: usize,
    tok_s: f64,
    tok_s_stddev: f64,
    samples: Vec<f64>,
}

pub fn main(args: Args) -> CliResult {
    if args.ring.cluster.is_some() {
        return ring::main(&args);
    }
    args.kernel.apply()?;
    let threads = if args.threads.is_empty() {
        vec![resolve_threads(None)?]
    } else {
        args.threads.iter().map(|&t| resolve_threads(Some(t))).collect::<CliResult<Vec<_>>>()?
    };
    // A tensor-parallel placement depends on the thread count: load per count then.
    let first = load_model_placed(&args.model, &args.numa.placement(threads[0])?)?;
    let model = &first.model;
    let kernel = blink_kernels::cpu::active();
    let order = blink_kernels::order::active();
    let file_type = crate::cmd::info::file_type_of(model);
    let place = |model: &Model| (args.lora > 0).then(|| Adapters::place(model, args.lora, args.lora_rank)).transpose();
    let first_adapters = place(model)?;
    if !args.json {
        outln!(
            "blink bench: model {} ({file_type}, {:.1} MiB), kernel {kernel}, dot order {}, {}, {} repetitions",
            model.cfg.name,
            model.file().file_size() as f64 / 1048576.0,
            super::info::order_line(kernel, order),
            numa_label(model),
            args.reps.max(1)
        )?;
        for (ty, route) in super::info::routes(model.file()) {
            outln!("route {ty}: {route}")?;
        }
        outln!("tiling: {}", super::info::tiling(model.file(), &[model.cfg.n_embd, model.cfg.n_ff]))?;
        if let Some(a) = &first_adapters {
            outln!("{}", a.describe())?;
        }
        outln!("| test | threads | batch | tok/s |")?;
        outln!("| --- | ---: | ---: | ---: |")?;
    }
    if let (true, Some(a)) = (args.json, &first_adapters) {
        eprintln!("blink bench: {}", a.describe());
    }
    let mut rows = Vec::new();
    let mut emit = |test: String, depth: usize, threads: usize, batch: usize, loras: usize, samples: Vec<f64>| -> CliResult {
        let (mean, sd) = mean_sd(&samples);
        rows.push(Row {
            model: model.cfg.name.clone(),
            file_type: file_type.clone(),
            kernel: kernel.name().to_string(),
            dot_order: order.name().to_string(),
            test,
            depth,
            threads,
            batch,
            loras,
            lora_rank: if loras > 0 { args.lora_rank } else { 0 },
            tok_s: mean,
            tok_s_stddev: sd,
            samples,
        });
        if !args.json {
            let r = rows.last().expect("just pushed");
            outln!("| {} | {threads} | {batch} | {mean:.2} ± {sd:.2} |", lora::label(r))?;
        }
        Ok(())
    };
    let mut placed = Vec::new();
    for &t in &threads {
        let (reloaded, placed_adapters);
        let (model, adapters) = if model.placement().numa && t != threads[0] {
            reloaded = load_model_placed(&args.model, &args.numa.placement(t)?)?;
            // Adapters live on the parts of the model that runs them.
            placed_adapters = place(&reloaded.model)?;
            (&reloaded.model, placed_adapters.as_ref())
        } else {
            (model, first_adapters.as_ref())
        };
        // What runs: a tensor-parallel placement has at least a thread per node (a flat
        // model is loaded once, for any count).
        let t = if model.placement().numa { model.placement().n_threads() } else { t };
        placed.push((t, accounting(model)));
        for &d in &args.depth {
            for &p in args.n_prompt.iter().filter(|&&p| p > 0) {
                let mut at = Depth::fill(model, t, 1, d, p, p, args.cache_type)?;
                let kinds = variants(adapters, 1);
                let samples = repeat_each(args.reps, kinds.len(), |k| prompt_speed(&mut at, p, kinds[k]))?;
                for (mixes, samples) in kinds.iter().zip(samples) {
                    emit(format!("pp{p}"), d, t, 1, mixes.len(), samples)?;
                }
            }
            for &n in args.n_gen.iter().filter(|&&n| n > 0) {
                for &b in args.batch.iter().filter(|&&b| b > 0) {
                    let mut at = Depth::fill(model, t, b, d, n.saturating_add(1), b, args.cache_type)?;
                    let kinds = variants(adapters, b);
                    let samples = repeat_each(args.reps, kinds.len(), |k| gen_speed(&mut at, n, kinds[k]))?;
                    for (mixes, samples) in kinds.iter().zip(samples) {
                        emit(format!("tg{n}"), d, t, b, mixes.len(), samples)?;
                    }
                }
            }
        }
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?)?;
    }
    for line in lora::ratios(&rows) {
        if args.json {
            eprintln!("{line}");
        } else {
            outln!("{line}")?;
        }
    }
    if args.bandwidth {
        // The thread counts that ran, which a tensor-parallel placement may have raised.
        let mut ran: Vec<usize> = placed.iter().map(|&(t, _)| t).collect();
        ran.sort_unstable();
        ran.dedup();
        report_bandwidth(model, &ran, &rows, args.json)?;
    }
    for (t, lines) in placed {
        for line in lines {
            let line = format!("memory at {t} thread(s): {line}");
            if args.json {
                eprintln!("{line}");
            } else {
                outln!("{line}")?;
            }
        }
    }
    Ok(())
}

fn numa_label(model: &Model) -> String {
    let p = model.placement();
    if p.numa {
        let kind = if p.topology.is_simulated() { "simulated" } else { "real" };
        format!("numa tp over {} {kind} node(s), threads {:?}", p.n_parts(), p.threads)
    } else {
        "numa off (flat pool)".to_string()
    }
}

/// Per-token weight bytes each node reads from its own memory and from other nodes',
/// from the placement (exact: every byte a decode step reads has one known home).
fn accounting(model: &Model) -> Vec<String> {
    let per_part = model.bytes_per_token_by_part();
    let total: usize = per_part.iter().sum();
    let mb = |b: f64| b / 1e6;
    if model.placement().numa {
        let mut lines: Vec<String> = per_part
            .iter()
            .enumerate()
            .map(|(i, &b)| format!("node {i} reads {:.2} MB/token of weights from its own memory, 0 MB from other nodes", mb(b as f64)))
            .collect();
        lines.push(format!("cross-node weight reads: 0 of {:.2} MB/token (0%)", mb(total as f64)));
        lines
    } else {
        // A flat pool on an n-node machine: threads everywhere read weights that live on one
        // node (or are spread evenly); either way (n-1)/n of the reads cross nodes.
        let n = model.placement().topology.n_nodes().max(blink_runtime::numa::Topology::detect().n_nodes());
        let share = (n - 1) as f64 / n as f64;
        vec![format!(
            "flat pool on {n} node(s): expected cross-node weight reads {:.2} of {:.2} MB/token ({:.0}%)",
            mb(total as f64 * share),
            mb(total as f64),
            100.0 * share
        )]
    }
}

/// The adapter lists a test of `seqs` sequences runs with: none (the base model), then,
/// with `--lora`, one adapter per sequence up to all of them.
fn variants(adapters: Option<&Adapters>, seqs: usize) -> Vec<&[Arc<LoraMix>]> {
    let mut out: Vec<&[Arc<LoraMix>]> = vec![&[]];
    out.extend(adapters.map(|a| a.for_seqs(seqs)));
    out
}

/// `kinds` variants of a test: one warm-up of each, then `reps` rounds that measure each
/// in turn. The samples of each variant.
pub(crate) fn repeat_each(reps: usize, kinds: usize, mut f: impl FnMut(usize) -> CliResult<f64>) -> CliResult<Vec<Vec<f64>>> {
    for k in 0..kinds {
        f(k)?;
    }
    let mut samples = vec![Vec::with_capacity(reps.max(1)); kinds];
    for _ in 0..reps.max(1) {
        for (k, s) in samples.iter_mut().enumerate() {
            s.push(f(k)?);
        }
    }
    Ok(samples)
}

pub(crate) fn mean_sd(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = if x.len() > 1 { x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

fn random_tokens(model: &Model, n: usize, seed: u64) -> Vec<u32> {
    random_ids(model.cfg.vocab_size, n, seed)
}

pub(crate) fn random_ids(vocab: usize, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| (rng.next_u64() % vocab as u64) as u32).collect()
}

/// Prompt tokens evaluated per step while filling a cache to its depth.
const FILL_ROWS: usize = 256;

/// Sequences whose caches hold `depth` (random) tokens, the state each repetition of a
/// test starts from.
struct Depth<'m> {
    runner: Runner<&'m Model>,
    seqs: Vec<SeqId>,
    depth: usize,
}

impl<'m> Depth<'m> {
    /// `n_seqs` sequences filled to `depth`, with room for `more` tokens each in steps of up
    /// to `max_rows` rows, one row per sequence with logits, on `threads` threads.
    fn fill(model: &'m Model, threads: usize, n_seqs: usize, depth: usize, more: usize, max_rows: usize, kv_type: KvType) -> CliResult<Depth<'m>> {
        // Whole blocks per sequence.
        let tokens = depth
            .checked_add(more)
            .and_then(|t| KvCache::blocks_for(t).checked_mul(BLOCK_TOKENS * n_seqs))
            .ok_or("the test's KV cache does not fit in memory; use smaller -p, -n, -d or --batch")?;
        let rows = max_rows.max(FILL_ROWS.min(depth));
        // Repetitions rewind to the depth: the sliding window before it must stay whole.
        let cfg = RunnerConfig { threads, kv_tokens: tokens, kv_type, max_rows: rows, max_logit_rows: n_seqs, max_ctx: depth + more, swa_full: true, detached: false };
        let mut runner = Runner::new(model, &cfg)?;
        let seqs: Vec<SeqId> = (0..n_seqs).map(|_| runner.kv_mut().new_seq()).collect();
        let mut step = Vec::with_capacity(FILL_ROWS);
        for (i, &seq) in seqs.iter().enumerate() {
            let tokens = random_tokens(model, depth, 100 + i as u64);
            for (c, chunk) in tokens.chunks(FILL_ROWS).enumerate() {
                step.clear();
                step.extend(chunk.iter().enumerate().map(|(j, &token)| StepRow::prompt(token, c * FILL_ROWS + j, seq)));
                runner.run(&step)?;
            }
        }
        Ok(Depth { runner, seqs, depth })
    }

    /// Forget what the last repetition added.
    fn rewind(&mut self) -> CliResult {
        for &seq in &self.seqs {
            self.runner.kv_mut().truncate(seq, self.depth)?;
        }
        Ok(())
    }
}

/// Tokens per second evaluating an `n`-token prompt in one step, after the depth (with
/// the first of `adapters`, if any).
fn prompt_speed(at: &mut Depth, n: usize, adapters: &[Arc<LoraMix>]) -> CliResult<f64> {
    at.rewind()?;
    let (seq, depth) = (at.seqs[0], at.depth);
    let rows: Vec<StepRow> = random_tokens(at.runner.model(), n, 1)
        .into_iter()
        .enumerate()
        // Computed as a prompt of `n` tokens is (`StepRow::in_prompt_of`), after the depth.
        .map(|(i, token)| StepRow { pos: depth + i, ..StepRow::prompt(token, i, seq).in_prompt_of(n) }.with_logits(i + 1 == n).with_adapter(lora::slot(0, adapters)))
        .collect();
    let start = Instant::now();
    at.runner.run_with(&rows, adapters)?;
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// Aggregate tokens per second generating `n` tokens in each sequence, after the depth;
/// sequence `i` runs with adapter `i % adapters.len()`, if any.
fn gen_speed(at: &mut Depth, n: usize, adapters: &[Arc<LoraMix>]) -> CliResult<f64> {
    at.rewind()?;
    let batch = at.seqs.len();
    let mut tokens = random_tokens(at.runner.model(), batch, 2);
    let mut rows: Vec<StepRow> = Vec::with_capacity(batch);
    let start = Instant::now();
    for i in 0..n {
        let pos = at.depth + i;
        rows.clear();
        rows.extend(at.seqs.iter().zip(&tokens).enumerate().map(|(s, (&seq, &token))| StepRow::decode(token, pos, seq).with_adapter(lora::slot(s, adapters))));
        at.runner.run_with(&rows, adapters)?;
        for (i, t) in tokens.iter_mut().enumerate() {
            *t = blink_engine::sampling::argmax(at.runner.scratch().logits(i));
        }
    }
    Ok((n * batch) as f64 / start.elapsed().as_secs_f64())
}

/// Measure bandwidth per thread count and relate each decode result to its bound.
fn report_bandwidth(model: &Model, threads: &[usize], rows: &[Row], json: bool) -> CliResult {
    let bytes = model.bytes_per_token() as f64;
    for &t in threads {
        let gbs = blink_runtime::bandwidth::triad_gbs(t).map_err(|e| format!("bandwidth at {t} thread(s): {e}"))?;
        let bound = gbs * 1e9 / bytes;
        let out = format!(
            "bandwidth: {t} thread(s) {gbs:.1} GB/s (triad); decode reads {:.1} MB/token, so decode ≤ {bound:.0} tok/s",
            bytes / 1e6
        );
        if json {
            eprintln!("{out}");
        } else {
            outln!("{out}")?;
        }
        for r in rows.iter().filter(|r| r.threads == t && r.batch == 1 && r.loras == 0 && r.test.starts_with("tg")) {
            let line = format!("  {} at {t} thread(s): {:.0} tok/s = {:.0}% of the bound", r.test, r.tok_s, 100.0 * r.tok_s / bound);
            if json {
                eprintln!("{line}");
            } else {
                outln!("{line}")?;
            }
        }
    }
    Ok(())
}
