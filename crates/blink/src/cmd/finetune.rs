//! `blink finetune`: train a LoRA adapter on the frozen GGUF model, on the CPU, from
//! OpenAI-style chat JSONL; write it as a PEFT directory or a llama.cpp LoRA GGUF.

use std::path::{Path, PathBuf};

use blink_model::lora::{self, LoraTensors, PeftMeta};
use blink_model::TensorPlacement;
use blink_train::data::load_examples;
use blink_train::optim::Decay;
use blink_train::run::{curve, fingerprint, init, parse_targets, FinetuneConfig, Finetune, Observer, Progress, Summary};

use crate::common::{load_model_placed, resolve_threads, CliResult, KernelArgs, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Training data: chat fine-tuning JSONL (`{"messages": [...]}` per line).
    #[arg(long = "data", value_name = "FILE")]
    data: PathBuf,
    /// Evaluation data in the same form: its loss and token accuracy after each epoch.
    #[arg(long = "eval", value_name = "FILE")]
    eval: Option<PathBuf>,
    /// Output directory: the adapter, the loss curve (loss.csv, loss.svg) and checkpoints.
    #[arg(short = 'o', long = "out", value_name = "DIR", required_unless_present = "dump_grads")]
    out: Option<PathBuf>,
    /// LoRA rank.
    #[arg(long = "rank", default_value_t = 8)]
    rank: usize,
    /// LoRA alpha (the delta is scaled by alpha / rank; default: twice the rank).
    #[arg(long = "alpha")]
    alpha: Option<f32>,
    /// Dropout on each adapter's input during training, as PEFT's lora_dropout.
    #[arg(long = "dropout", default_value_t = 0.0)]
    dropout: f32,
    /// Projections to adapt: q,k,v,o,gate,up,down (or all).
    #[arg(long = "targets", default_value = "all")]
    targets: String,
    /// Peak learning rate.
    #[arg(long = "lr", default_value_t = 1e-4)]
    lr: f64,
    #[arg(long = "epochs", default_value_t = 3)]
    epochs: u64,
    /// Tokens per packed batch (whole examples; none may be longer).
    #[arg(long = "batch-tokens", default_value_t = 512)]
    batch_tokens: usize,
    /// Most examples per batch (default: as many as fit in --batch-tokens), as the
    /// `batch_size` of OpenAI's fine-tuning jobs.
    #[arg(long = "batch-size", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    batch_size: Option<u64>,
    /// Batches per optimizer step (gradient accumulation).
    #[arg(long = "accum", default_value_t = 1)]
    accum: usize,
    /// Linear warm-up steps.
    #[arg(long = "warmup", default_value_t = 0)]
    warmup: u64,
    /// Rate after warm-up: cosine, linear or constant.
    #[arg(long = "schedule", default_value = "cosine", value_parser = ["cosine", "linear", "constant"])]
    schedule: String,
    #[arg(long = "weight-decay", default_value_t = 0.0)]
    weight_decay: f64,
    /// Clip the gradients' global L2 norm to this (0: no clipping).
    #[arg(long = "clip", default_value_t = 1.0)]
    clip: f64,
    #[arg(long = "seed", default_value_t = 42)]
    seed: u64,
    /// Start from this adapter (PEFT directory or LoRA GGUF) instead of a fresh one; its
    /// rank, alpha and targets are kept.
    #[arg(long = "init-adapter", value_name = "PATH")]
    init_adapter: Option<PathBuf>,
    /// Write a checkpoint every N optimizer steps (and at the end).
    #[arg(long = "checkpoint-every", value_name = "N")]
    checkpoint_every: Option<u64>,
    /// Continue from the checkpoint in the output directory.
    #[arg(long = "resume")]
    resume: bool,
    /// Adapter format: peft (a directory) or gguf (DIR/adapter.gguf).
    #[arg(long = "format", default_value = "peft", value_parser = ["peft", "gguf"])]
    format: String,
    /// Compute the loss and gradients of the first batch for the initial adapter, write
    /// them (PEFT's tensor names) to FILE.safetensors, print the loss and stop.
    #[arg(long = "dump-grads", value_name = "FILE")]
    dump_grads: Option<PathBuf>,
    /// Print a JSON summary as the last line of standard output.
    #[arg(long = "json")]
    json: bool,
    /// Compute threads (default: all available CPUs).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    #[command(flatten)]
    kernel: KernelArgs,
}

pub fn main(args: Args) -> CliResult {
    args.kernel.apply()?;
    if !(0.0..1.0).contains(&args.dropout) {
        return Err(format!("--dropout must be in [0, 1), not {}", args.dropout).into());
    }
    if args.rank == 0 {
        return Err("--rank must be at least 1".into());
    }
    if !args.lr.is_finite() || args.lr <= 0.0 {
        return Err(format!("--lr must be a positive number, not {}", args.lr).into());
    }
    let targets = parse_targets(&args.targets).map_err(|e| format!("--targets: {e}"))?;
    let threads = resolve_threads(args.threads)?;
    let model_path = args.model.path()?;
    let loaded = load_model_placed(&args.model, &TensorPlacement::flat(threads))?;
    let model = &loaded.model;
    let template = loaded.template.as_ref().ok_or("the model has no chat template to render the examples with")?;
    let train = load_examples(&args.data, &loaded.tokenizer, template).map_err(|e| format!("{}: {e}", args.data.display()))?;
    let eval = match &args.eval {
        Some(p) => load_examples(p, &loaded.tokenizer, template).map_err(|e| format!("{}: {e}", p.display()))?,
        None => Vec::new(),
    };
    let params = match &args.init_adapter {
        Some(p) => lora::read(p, &model.cfg).map_err(|e| e.about(p))?,
        None => init::fresh(&model.cfg, args.rank, args.alpha.unwrap_or(2.0 * args.rank as f32), &targets, args.seed),
    };
    let cfg = FinetuneConfig {
        lr: args.lr,
        epochs: args.epochs,
        batch_tokens: args.batch_tokens,
        batch_examples: args.batch_size.map_or(usize::MAX, |n| n as usize),
        accum: args.accum,
        warmup: args.warmup,
        decay: match args.schedule.as_str() {
            "linear" => Decay::Linear,
            "constant" => Decay::Constant,
            _ => Decay::Cosine,
        },
        weight_decay: args.weight_decay,
        clip: (args.clip > 0.0).then_some(args.clip),
        dropout: args.dropout,
        seed: args.seed,
        checkpoint_every: args.checkpoint_every,
    };
    let fingerprint = fingerprint(&model_path, &train, &eval, &params, &cfg, &args.format);
    let mut run = Finetune::new(model, cfg, train, eval, params, fingerprint)?;
    let pool = model.pool(threads).map_err(|e| format!("cannot start the compute threads: {e}"))?;

    if let Some(file) = &args.dump_grads {
        let (loss, grads) = run.first_batch_gradients(&pool)?;
        lora::write_peft_tensors(file, &grads, &model.cfg)?;
        outln!("loss {:.6} over {} targets", loss.mean(), loss.targets)?;
        return Ok(());
    }
    let out = args.out.as_deref().expect("clap requires --out without --dump-grads");
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    if args.resume && run.resume(out)? {
        eprintln!("blink: resuming from the checkpoint in {}", out.display());
    }
    eprintln!(
        "blink: {} optimizer steps over {} epochs; {:.1} MiB of training buffers",
        run.total_steps(),
        args.epochs,
        run.buffer_bytes() as f64 / (1 << 20) as f64
    );
    let mut bar = Bar::new(run.total_steps());
    let summary = run.run(&pool, out, &mut bar)?;
    bar.finish();
    write_adapter(out, &args.format, run.params(), model, args.dropout)?;
    curve::write(out, run.curve()).map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!("blink: adapter written to {}", out.display());
    if args.json {
        outln!("{}", summary_json(&summary))?;
    }
    Ok(())
}

fn write_adapter(out: &Path, format: &str, params: &LoraTensors, model: &blink_model::Model, dropout: f32) -> CliResult {
    if format == "gguf" {
        lora::write_gguf(&out.join("adapter.gguf"), params, &model.cfg, None)?;
    } else {
        let meta = PeftMeta { base_model_name_or_path: Some(model.cfg.name.clone()), lora_dropout: dropout };
        lora::write_peft(out, params, &model.cfg, &meta)?;
    }
    Ok(())
}

/// What makes one run the same as another: the data, the model, the starting adapter and
/// every setting that changes the numbers (threads and checkpoint spacing do not).
fn summary_json(s: &Summary) -> String {
    serde_json::json!({
        "steps": s.steps,
        "trained_tokens": s.trained_tokens,
        "trained_tokens_per_s": s.tokens_per_s,
        "peak_rss_bytes": peak_rss_bytes(),
        "train_loss": s.train_loss,
        "eval_loss": s.eval_loss,
        "eval_accuracy": s.eval_accuracy,
    })
    .to_string()
}

/// The process's peak resident set, from `getrusage` (kibibytes on Linux).
fn peak_rss_bytes() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut u) == 0 {
            u.ru_maxrss.max(0) as u64 * 1024
        } else {
            0
        }
    }
}

/// The progress bar: step, loss, rate, tokens/s and time left (a line per step when
/// standard error is not a terminal).
struct Bar {
    bar: indicatif::ProgressBar,
    /// The first step this process ran, and when it ended (a resumed run's time left is
    /// reckoned from its own steps).
    first: Option<(u64, std::time::Duration)>,
}

impl Bar {
    fn new(total: u64) -> Bar {
        let bar = indicatif::ProgressBar::new(total);
        let style = indicatif::ProgressStyle::with_template("{bar:30} step {pos}/{len} {msg} [{elapsed_precise}, {eta} left]").expect("a valid template");
        bar.set_style(style);
        Bar { bar, first: None }
    }

    fn finish(&self) {
        self.bar.finish();
    }

    /// Seconds left at the pace of this process's steps so far.
    fn seconds_left(&mut self, p: &Progress) -> f64 {
        let (step0, t0) = *self.first.get_or_insert((p.step, p.elapsed));
        let done = p.step.saturating_sub(step0);
        if done == 0 {
            return f64::NAN;
        }
        (p.elapsed - t0).as_secs_f64() / done as f64 * p.total_steps.saturating_sub(p.step) as f64
    }
}

impl Observer for Bar {
    fn step(&mut self, p: &Progress) {
        let left = self.seconds_left(p);
        self.bar.set_position(p.step);
        self.bar.set_message(format!("loss {:.4} lr {:.2e} {:.0} tok/s", p.loss, p.lr, p.tokens_per_s));
        if !self.bar.is_hidden() {
            return;
        }
        // Not a terminal: one line per step on stderr instead.
        let left = if left.is_finite() { format!(", {left:.0} s left") } else { String::new() };
        eprintln!("step {}/{} epoch {} loss {:.4} lr {:.3e} grad-norm {:.3} {:.1} tok/s{left}", p.step, p.total_steps, p.epoch + 1, p.loss, p.lr, p.grad_norm, p.tokens_per_s);
    }

    fn eval(&mut self, epoch: u64, loss: f64, accuracy: f64) {
        let line = format!("epoch {}: eval loss {loss:.4}, token accuracy {:.1}%", epoch + 1, accuracy * 100.0);
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    fn checkpoint(&mut self, step: u64) {
        if self.bar.is_hidden() {
            eprintln!("checkpoint at step {step}");
        }
    }
}
