//! `blink calibrate`: measure the steps a serving engine runs on this machine and fit the
//! latency model's coefficients, for `blink serve --latency FILE`.
//!
//! It times inference passes over a sweep of shapes (`passes`: prompt chunks of several
//! lengths at several depths, decode batches over several contexts, mixes of the two,
//! with and without adapters) and the units of a fine-tuning run (`units`: forwards and
//! backwards of several layer counts over batches of several example lengths, loss heads,
//! optimizer updates), on a pool like the engine's, then fits both parts
//! ([`Coefficients::fit`]) and writes them with the setup they were measured on. The fit
//! report (median and 95th-percentile relative error per kind of step) is printed.

mod passes;
mod units;

use std::path::PathBuf;
use std::time::Instant;

use blink_engine::serve::latency::{Coefficients, Sample};
use blink_model::TensorPlacement;
use serde_json::{json, Map};

use crate::common::{load_model_placed, resolve_threads, CliResult, KernelArgs, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Where to write the coefficients (JSON).
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    out: PathBuf,
    /// Compute threads (as `serve -t`).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// Times each shape is measured (after one warm-up).
    #[arg(short = 'r', long = "reps", default_value_t = 3)]
    reps: usize,
    /// A shorter sweep (fewer shapes), for tests.
    #[arg(long = "quick")]
    quick: bool,
    /// Also print every sample as a JSON line on stderr.
    #[arg(long = "verbose")]
    verbose: bool,
    #[command(flatten)]
    kernel: KernelArgs,
}

pub fn main(args: Args) -> CliResult {
    args.kernel.apply()?;
    if args.reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    let threads = resolve_threads(args.threads)?;
    let path = args.model.path()?;
    let loaded = load_model_placed(&args.model, &TensorPlacement::flat(threads))?;
    let model = &loaded.model;
    let started = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    eprintln!("blink: timing inference passes on {threads} thread(s)");
    passes::sweep(model, threads, args.reps, args.quick, &mut samples)?;
    eprintln!("blink: timing fine-tuning units");
    units::sweep(model, threads, args.reps, args.quick, &mut samples)?;
    if args.verbose {
        for s in &samples {
            eprintln!("{}", describe(s));
        }
    }
    let mut coefficients = Coefficients::fit(&samples);
    coefficients.setup = setup(&path, threads);
    coefficients.save(&args.out)?;
    let fit = &coefficients.fit;
    outln!("{} pass and {} unit samples in {:.1} s; coefficients written to {}", fit.pass_samples, fit.unit_samples, started.elapsed().as_secs_f64(), args.out.display())?;
    outln!("| kind | samples | median error | p95 error | max error |")?;
    outln!("| --- | ---: | ---: | ---: | ---: |")?;
    for k in &fit.kinds {
        outln!("| {} | {} | {:.1}% | {:.1}% | {:.1}% |", k.kind.name(), k.count, 100.0 * k.median_abs_error, 100.0 * k.p95_abs_error, 100.0 * k.max_abs_error)?;
    }
    if !fit.unexercised.is_empty() {
        outln!("not measured: {}", fit.unexercised.join(", "))?;
    }
    Ok(())
}

/// What the coefficients were measured on.
fn setup(model: &std::path::Path, threads: usize) -> Map<String, serde_json::Value> {
    let size = std::fs::metadata(model).map_or(0, |m| m.len());
    let v = json!({
        "model": model.file_name().map(|n| n.to_string_lossy().into_owned()),
        "model_bytes": size,
        "threads": threads,
        "kernel": blink_kernels::cpu::active().name(),
        "dot_order": blink_kernels::order::active().name(),
    });
    v.as_object().cloned().unwrap_or_default()
}

fn describe(s: &Sample) -> String {
    match s {
        Sample::Pass { cost, time } => format!("{{\"pass\": \"{cost:?}\", \"seconds\": {}}}", time.as_secs_f64()),
        Sample::Unit { cost, time } => format!("{{\"unit\": \"{cost:?}\", \"seconds\": {}}}", time.as_secs_f64()),
    }
}
