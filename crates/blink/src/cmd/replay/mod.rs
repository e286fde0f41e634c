//! `blink replay`: replay a request trace open-loop against an OpenAI-compatible server and
//! report latency against SLO targets, throughput, the engine's busy fraction and, when
//! the server exports them, the fine-tuning rate and the latency predictor's error.
//!
//! The trace comes from a CSV (`trace`) or a seeded generator (`shapes`); with
//! `--utilization` its rate is set from the server's capacity, measured first by a short
//! closed-loop probe (`probe`). Requests are streaming `/v1/completions` with prompts no
//! other request shares (`prompts`), sent at their times (`run`) while `/metrics` is read
//! about once a second (`scrape`); the result is a table or one JSON line (`summary`) and
//! optionally an SVG over time (`svg`). The server is one at `--url`, or `blink serve`
//! started in-process with the model and engine flags (`cmd::client::Target`), whose
//! runtime is apart from the client's so the client's timers keep the normal priority.

mod job;
mod probe;
mod prompts;
mod run;
mod scrape;
mod shapes;
mod summary;
mod svg;
mod trace;

use std::path::PathBuf;

use blink_server::client::Client;
use serde_json::Value;

use crate::cmd::client::{ready, timed_stream, Target};
use crate::common::CliResult;
use prompts::PromptStyle;
use shapes::{Lengths, Shape};
use summary::{Slo, Summary, TraceInfo};
use trace::Arrival;

#[derive(clap::Args)]
pub struct Args {
    /// Replay this CSV trace (timestamp_s,prompt_tokens,max_tokens; a header line is
    /// optional) instead of generating one; its times count from its first request.
    #[arg(long = "trace", value_name = "FILE.csv", conflicts_with_all = ["shape", "cv", "valley_ratio", "prompt_tokens", "output_tokens"])]
    trace: Option<PathBuf>,
    /// Arrivals of a generated trace: poisson, gamma (bursty, see --cv), burst-light (2 s
    /// peaks, 4 s valleys) or burst-dense (4 s peaks, 2 s valleys), DeltaServe's shapes.
    #[arg(long, default_value = "poisson")]
    shape: String,
    /// Requests in the trace (default 1000; of a CSV, its first N, default all).
    #[arg(short = 'n', long = "requests")]
    requests: Option<usize>,
    /// Mean arrival rate in requests/s (a CSV's times are scaled to it).
    #[arg(long, conflicts_with = "utilization", allow_negative_numbers = true)]
    rate: Option<f64>,
    /// Offered load as a share (0 < U ≤ 1) of the server's capacity, measured first by a
    /// closed-loop probe of requests of the trace's mean shape.
    #[arg(long, allow_negative_numbers = true)]
    utilization: Option<f64>,
    /// Seed of the generated trace and of the prompts.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Coefficient of variation of the gamma shape's gaps (1: Poisson).
    #[arg(long, default_value_t = 4.0, allow_negative_numbers = true)]
    cv: f64,
    /// Rate in the burst shapes' valleys, as a share of the peak rate.
    #[arg(long = "valley-ratio", default_value_t = 0.0, allow_negative_numbers = true)]
    valley_ratio: f64,
    /// Prompt lengths of a generated trace, MIN:MAX tokens drawn log-uniformly (or N).
    #[arg(long = "prompt-tokens", default_value = "32:512")]
    prompt_tokens: String,
    /// Output lengths (max_tokens) of a generated trace, MIN:MAX drawn log-uniformly (or N).
    #[arg(long = "output-tokens", default_value = "16:128")]
    output_tokens: String,
    /// Write the trace replayed (after any rate scaling) as CSV.
    #[arg(long = "save-trace", value_name = "FILE.csv")]
    save_trace: Option<PathBuf>,
    /// Write load, latency and fine-tuning rate over time as an SVG.
    #[arg(long, value_name = "FILE.svg")]
    svg: Option<PathBuf>,
    /// Print the summary as one JSON object (the last line of stdout).
    #[arg(long)]
    json: bool,
    /// Send prompts as text of about the right length, for servers that take no token ids.
    #[arg(long = "text-prompts")]
    text_prompts: bool,
    /// Token ids prompts are drawn from, LO:HI.
    #[arg(long = "token-ids", default_value = "1000:9999", value_name = "LO:HI")]
    token_ids: String,
    /// The `model` to ask for (default: with --url, the first of /v1/models; none otherwise).
    #[arg(long = "served-model", value_name = "NAME")]
    served_model: Option<String>,
    /// Clients of the capacity probe (default: the in-process server's --parallel, else 16).
    #[arg(long = "probe-concurrency")]
    probe_concurrency: Option<usize>,
    /// Requests each probe client sends back to back.
    #[arg(long = "probe-rounds", default_value_t = 2)]
    probe_rounds: usize,
    /// A name for this run in the report (a baseline, a configuration).
    #[arg(long)]
    label: Option<String>,
    /// Train a fine-tuning job on this chat JSONL while the trace plays (uploaded and
    /// created through the server's files and fine-tuning API before the first request,
    /// cancelled after the last); the report gives the committed training tokens/s.
    #[arg(long = "finetune", value_name = "FILE.jsonl")]
    finetune: Option<PathBuf>,
    /// Epochs of that job (enough that it outlasts the trace).
    #[arg(long = "finetune-epochs", default_value_t = 50)]
    finetune_epochs: u64,
    /// Leave the job running after the trace.
    #[arg(long = "keep-job")]
    keep_job: bool,
    #[command(flatten)]
    target: Target,
}

/// Where the trace comes from, checked before any server is touched.
enum Source {
    Csv { name: String, arrivals: Vec<Arrival> },
    Generated { shape: Shape, n: usize, prompts: Lengths, outputs: Lengths },
}

pub fn main(args: Args) -> CliResult {
    let source = source(&args)?;
    // The targets attainment is measured against are the engine flags' (--slo-ttft,
    // --slo-tpot), which an in-process server's co-serving also keeps.
    let targets = &args.target.engine.coserve;
    let slo = Slo { ttft: positive("slo-ttft", Some(targets.slo_ttft))?, tpot: positive("slo-tpot", Some(targets.slo_tpot))? };
    let rate = positive("rate", args.rate)?;
    if let Some(u) = args.utilization {
        if !(u > 0.0 && u <= 1.0) {
            return Err(format!("--utilization must be within (0, 1], got {u}").into());
        }
    }
    if rate.is_none() && args.utilization.is_none() && matches!(source, Source::Generated { .. }) {
        return Err("a generated trace needs --rate R (requests/s) or --utilization U (a share of the measured capacity)".into());
    }
    if args.probe_concurrency == Some(0) || args.probe_rounds == 0 {
        return Err("--probe-concurrency and --probe-rounds must be at least 1".into());
    }
    let ids = prompts::parse_ids(&args.token_ids)?;
    for (flag, path) in [("--svg", &args.svg), ("--save-trace", &args.save_trace)] {
        if let Some(dir) = path.as_ref().and_then(|p| p.parent()).filter(|d| !d.as_os_str().is_empty() && !d.is_dir()) {
            return Err(format!("{flag}: {} is not a directory", dir.display()).into());
        }
    }
    let client_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("blink-replay").enable_all().build()?;
    let (server_rt, url, server) = match &args.target.url {
        Some(url) => (None, url.clone(), None),
        None => {
            let rt = crate::common::io_runtime("blink-replay-server")?;
            let (url, server) = rt.block_on(args.target.server("replay"))?;
            (Some(rt), url, server)
        }
    };
    let result = client_rt.block_on(drive(&args, source, slo, rate, ids, &url));
    if let (Some(rt), Some(server)) = (&server_rt, server) {
        rt.block_on(server.shutdown());
    }
    let summary = result?;
    if args.json {
        outln!("{}", summary.json())?;
    } else {
        outln!("{}", summary.table())?;
    }
    Ok(())
}

/// The trace's source from the flags.
fn source(args: &Args) -> CliResult<Source> {
    if args.requests == Some(0) {
        return Err("--requests must be at least 1".into());
    }
    if let Some(path) = &args.trace {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut arrivals = trace::parse_csv(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        arrivals.truncate(args.requests.unwrap_or(usize::MAX));
        let t0 = arrivals[0].at;
        arrivals.iter_mut().for_each(|a| a.at -= t0);
        return Ok(Source::Csv { name: path.display().to_string(), arrivals });
    }
    Ok(Source::Generated {
        shape: Shape::named(&args.shape, args.cv, args.valley_ratio)?,
        n: args.requests.unwrap_or(1000),
        prompts: Lengths::parse(&args.prompt_tokens).map_err(|e| format!("--prompt-tokens: {e}"))?,
        outputs: Lengths::parse(&args.output_tokens).map_err(|e| format!("--output-tokens: {e}"))?,
    })
}

fn positive(name: &str, v: Option<f64>) -> CliResult<Option<f64>> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => Err(format!("--{name} must be a positive number, got {x}").into()),
        v => Ok(v),
    }
}

/// Everything that talks to the server: readiness, a first request, the probe, the replay.
async fn drive(args: &Args, source: Source, slo: Slo, rate: Option<f64>, ids: (u32, u32), url: &str) -> CliResult<Summary> {
    let client = args.target.client(url)?;
    ready(&client).await?;
    let model = match (&args.served_model, &args.target.url) {
        (Some(m), _) => Some(m.clone()),
        (None, Some(_)) => first_model(&client).await,
        (None, None) => None,
    };
    let style = PromptStyle { ids, text: args.text_prompts, model, seed: args.seed };
    let warm = style.body(u64::MAX, 16, 2); // an index no trace or probe uses
    timed_stream(&client, "/v1/completions", &warm).await.map_err(|e| {
        let how = if args.text_prompts { "text" } else { "token ids (--text-prompts sends text)" };
        format!("the server did not complete a first request (a prompt of 16 {how}): {e}")
    })?;

    // The trace at unit rate (its shape of lengths), then its rate.
    let sketch = match &source {
        Source::Csv { arrivals, .. } => arrivals.clone(),
        Source::Generated { shape, n, prompts, outputs } => shapes::generate(*shape, *n, 1.0, *prompts, *outputs, args.seed),
    };
    let (mean_prompt, mean_out) = trace::mean_shape(&sketch);
    let capacity = match args.utilization {
        None => None,
        Some(_) => {
            let c = args.probe_concurrency.unwrap_or(if args.target.url.is_some() { 16 } else { args.target.engine.parallel });
            let (p, o) = (mean_prompt.round().max(1.0) as usize, mean_out.round().max(1.0) as usize);
            eprintln!("blink replay: probing capacity: {c} clients × {} requests of {p} + {o} tokens", args.probe_rounds);
            let cap = probe::probe(&client, &style, c, args.probe_rounds, p, o).await?;
            eprintln!("blink replay: capacity {:.2} req/s ({:.1} s)", cap.rps, cap.seconds);
            Some(cap)
        }
    };
    let rate = rate.or_else(|| Some(args.utilization? * capacity.as_ref()?.rps));
    let (arrivals, info) = match source {
        Source::Csv { name, mut arrivals } => {
            if let Some(r) = rate {
                trace::rescale(&mut arrivals, r)?;
            }
            let offered = trace::mean_rate(&arrivals).unwrap_or(0.0);
            (arrivals, TraceInfo { source: name, seed: None, offered_rps: offered, mean_prompt_tokens: mean_prompt, mean_max_tokens: mean_out })
        }
        Source::Generated { shape, n, prompts, outputs } => {
            let r = rate.ok_or("a generated trace needs --rate or --utilization")?;
            let name = match shape {
                Shape::Gamma { cv } => format!("gamma (cv {cv})"),
                _ => args.shape.clone(),
            };
            let info = TraceInfo { source: name, seed: Some(args.seed), offered_rps: r, mean_prompt_tokens: mean_prompt, mean_max_tokens: mean_out };
            (shapes::generate(shape, n, r, prompts, outputs, args.seed), info)
        }
    };
    if let Some(path) = &args.save_trace {
        std::fs::write(path, trace::to_csv(&arrivals)).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let span = arrivals.last().map_or(0.0, |a| a.at);
    eprintln!(
        "blink replay: {} requests, {} at {:.2} req/s (mean {:.0} prompt + {:.0} output tokens), arrivals over {:.1} s",
        arrivals.len(),
        info.source,
        info.offered_rps,
        mean_prompt,
        mean_out,
        span
    );
    let job = match &args.finetune {
        Some(file) => {
            let model = match &style.model {
                Some(m) => m.clone(),
                None => first_model(&client).await.ok_or("--finetune: the server lists no model to fine-tune")?,
            };
            let id = job::start(&client, file, &model, args.finetune_epochs, args.seed).await?;
            eprintln!("blink replay: fine-tuning job {id} running");
            Some(id)
        }
        None => None,
    };
    let run = run::replay(&client, &arrivals, &style).await;
    if let Some(id) = job.filter(|_| !args.keep_job) {
        job::cancel(&client, &id).await?;
    }
    let mut summary = Summary::new(&run, info, slo, args.utilization, capacity);
    summary.label = args.label.clone();
    if let Some((p99, max)) = summary.late() {
        eprintln!("blink replay: warning: the client fell behind its schedule (send lateness p99 {:.1} ms, max {:.1} ms)", p99 * 1e3, max * 1e3);
    }
    if let Some(path) = &args.svg {
        let title = format!("blink replay: {}", summary.title());
        std::fs::write(path, svg::render(&run, slo, &title)).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(summary)
}

/// The first model a server lists, if it lists any.
async fn first_model(client: &Client) -> Option<String> {
    let r = client.get("/v1/models").await.ok().filter(|r| r.status == 200)?;
    let v: Value = r.json().ok()?;
    v["data"][0]["id"].as_str().map(str::to_owned)
}
