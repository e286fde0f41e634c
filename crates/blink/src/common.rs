//! Arguments and loading shared by the subcommands that open a model.

use std::path::{Path, PathBuf};

use blink_engine::Loaded;
use blink_gguf::GgufFile;
use blink_model::{KvType, Model, TensorPlacement};
use clap::Args;

/// Errors of the CLI: one line each.
pub type CliResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// The text a command works on: given inline (`-p`) or read from a file (`-f`, `-` for
/// standard input), as llama.cpp's tools take it.
#[derive(Args, Clone, Debug)]
pub struct PromptArgs {
    /// The prompt.
    #[arg(short = 'p', long = "prompt", allow_hyphen_values = true, required_unless_present_any = ["file", "stdin"], conflicts_with_all = ["file", "stdin"])]
    prompt: Option<String>,
    /// Read the prompt from this file (`-`: standard input); one final newline is dropped.
    #[arg(short = 'f', long = "file", value_name = "FILE", conflicts_with = "stdin")]
    file: Option<PathBuf>,
    /// Read the prompt from standard input (as `-f -`; llama-tokenize's spelling).
    #[arg(long = "stdin")]
    stdin: bool,
    /// Take the prompt's backslash escapes literally (by default \n, \r, \t, \', \", \\
    /// and \xNN are turned into the characters they stand for, as llama.cpp's tools do).
    #[arg(long = "no-escape", conflicts_with = "escape")]
    no_escape: bool,
    /// Turn backslash escapes into characters: the default, accepted for llama.cpp's `-e`.
    #[arg(short = 'e', long = "escape")]
    escape: bool,
}

impl PromptArgs {
    /// The prompt's text, its escapes processed unless `--no-escape`.
    pub fn text(&self) -> CliResult<String> {
        self.unescape("the prompt", self.raw_text()?)
    }

    /// `text` (named `what` in errors) with its escapes processed unless `--no-escape`, as
    /// llama.cpp treats its prompt and its reverse prompts.
    pub fn unescape(&self, what: &str, text: String) -> CliResult<String> {
        if self.no_escape {
            return Ok(text);
        }
        let bytes = process_escapes(&text);
        String::from_utf8(bytes).map_err(|e| {
            format!("{what} is not UTF-8 once its escapes are processed (invalid byte at offset {}; --no-escape takes them literally)", e.utf8_error().valid_up_to()).into()
        })
    }

    fn raw_text(&self) -> CliResult<String> {
        let path = match (&self.file, self.stdin) {
            (Some(path), _) => path.as_path(),
            (None, true) => Path::new("-"),
            (None, false) => return Ok(self.prompt.clone().unwrap_or_default()),
        };
        let bytes = read_input(path)?;
        let mut text = String::from_utf8(bytes).map_err(|e| format!("{}: not UTF-8 text (invalid byte at offset {})", path.display(), e.utf8_error().valid_up_to()))?;
        if text.ends_with('\n') {
            text.pop();
        }
        Ok(text)
    }
}

/// The bytes of the file at `path`, or of standard input for `-`.
pub fn read_input(path: &Path) -> CliResult<Vec<u8>> {
    if path.as_os_str() == "-" {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes).map_err(|e| format!("cannot read standard input: {e}"))?;
        return Ok(bytes);
    }
    Ok(std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?)
}

/// `text` with llama.cpp's escapes turned into bytes: `\n`, `\r`, `\t`, `\'`, `\"`,
/// `\\`, and `\x` with two hex digits; any other backslash stays as it is.
pub fn process_escapes(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 == b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let hex = |at: usize| b.get(at).and_then(|&c| (c as char).to_digit(16));
        let (byte, used) = match b[i + 1] {
            b'n' => (b'\n', 2),
            b'r' => (b'\r', 2),
            b't' => (b'\t', 2),
            b'\'' | b'"' | b'\\' => (b[i + 1], 2),
            b'x' => match (hex(i + 2), hex(i + 3)) {
                (Some(h), Some(l)) => ((h * 16 + l) as u8, 4),
                _ => (b'\\', 1),
            },
            _ => (b'\\', 1),
        };
        out.push(byte);
        i += used;
    }
    out
}

/// Which model to load.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Path to a GGUF model (default: SmolLM2-135M-Instruct Q4_1, fetched on first use).
    #[arg(short = 'm', long = "model", value_name = "PATH")]
    pub model: Option<PathBuf>,
}

impl ModelArgs {
    /// The model path, fetching the default model if needed.
    pub fn path(&self) -> CliResult<PathBuf> {
        match &self.model {
            Some(p) => Ok(p.clone()),
            None => Ok(blink_model::fetch::ensure_default_model()?),
        }
    }

    /// Open and validate the file (every subcommand validates all of it before use).
    pub fn open(&self) -> CliResult<GgufFile> {
        let path = self.path()?;
        GgufFile::open(&path).map_err(|e| format!("{}: {e}", path.display()).into())
    }
}

/// Which kernel path to use.
#[derive(Args, Clone, Debug)]
pub struct KernelArgs {
    /// Kernel path: scalar, avx2, avx-vnni, avx512, neon or neon-i8mm (default: the best this CPU supports; also
    /// settable with BLINK_KERNEL).
    #[arg(long = "kernel")]
    pub kernel: Option<String>,
    /// How quantized dot products apply block scales: llama (llama.cpp's x86 order: the
    /// same logits and greedy text as llama.cpp) or block (one float step per block:
    /// batched matrix products ~1.65× faster, results differ from llama.cpp in the last
    /// bits). Default llama; also settable with BLINK_DOT_ORDER.
    #[arg(long = "dot-order", value_name = "ORDER")]
    pub dot_order: Option<String>,
    /// Which build of llama.cpp the llama order reproduces: avx512 or avx2 (llama.cpp
    /// built for AVX-512 and for AVX2 round some float results differently). Default: the
    /// kernel path's (avx2 and avx-vnni: avx2; avx512: avx512; scalar: this CPU's best);
    /// also settable with BLINK_LLAMA_FLAVOUR.
    #[arg(long = "llama-flavour", value_name = "BUILD")]
    pub llama_flavour: Option<String>,
    /// Keep the weight matrices in the file's memory map, row-major, rather than repack
    /// them for the kernels: no copy in memory, so a model larger than memory pages in
    /// from disk (slower products).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
}

/// `--no-repack`, fixed (like the kernel path) before any model is loaded.
static NO_REPACK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl KernelArgs {
    /// Fix the kernel path, dot order and llama.cpp flavour before any model is loaded.
    pub fn apply(&self) -> CliResult {
        use blink_kernels::{cpu, flavour, order};
        NO_REPACK.store(self.no_repack, std::sync::atomic::Ordering::Relaxed);
        if let Some(name) = &self.kernel {
            let isa = cpu::Isa::parse(name).ok_or_else(|| cpu::IsaError::Unknown(name.clone()))?;
            cpu::force(isa)?;
        }
        if let Some(name) = &self.dot_order {
            let o = order::DotOrder::parse(name).ok_or_else(|| order::OrderError::Unknown(name.clone()))?;
            order::force(o)?;
        }
        if let Some(name) = &self.llama_flavour {
            let f = flavour::Flavour::parse(name).ok_or_else(|| flavour::FlavourError::Unknown(name.clone()))?;
            if order::active() == order::DotOrder::Block {
                return Err("--llama-flavour applies to --dot-order llama (the block order is the same on every CPU)".into());
            }
            flavour::force(f)?;
        }
        Ok(())
    }
}

/// Compute options.
#[derive(Args, Clone, Debug)]
pub struct ComputeArgs {
    /// Compute threads (default: all available CPUs).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Context size in tokens (default: the model's, at most 4096; 0: the model's).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Most prompt tokens evaluated per step.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    /// KV cache element type: f16 or f32.
    #[arg(long = "cache-type", default_value = "f16", value_parser = parse_kv_type)]
    pub cache_type: KvType,
    /// Keep every position of a model's sliding-window layers in the KV cache (otherwise
    /// they keep a window's worth and give the rest of their memory back).
    #[arg(long = "swa-full")]
    pub swa_full: bool,
    #[command(flatten)]
    pub kernel: KernelArgs,
    #[command(flatten)]
    pub numa: NumaArgs,
}

/// How to use NUMA nodes.
#[derive(Args, Clone, Debug, Default)]
pub struct NumaArgs {
    /// NUMA mode: `off` (one flat pool) or `tp` (tensor parallel: one part of the model per
    /// node, in node-local memory). Default: tp when the machine has more than one node.
    #[arg(long = "numa", value_parser = ["off", "tp"])]
    pub numa: Option<String>,
    /// Simulate this many NUMA nodes by splitting the allowed CPUs (implies --numa tp).
    #[arg(long = "numa-nodes")]
    pub numa_nodes: Option<usize>,
}

impl NumaArgs {
    /// The placement for `threads` compute threads.
    pub fn placement(&self, threads: usize) -> CliResult<TensorPlacement> {
        let placement = self.placement_for(threads)?;
        if placement.n_threads() > threads {
            eprintln!("blink: note: each of the {} NUMA nodes needs a thread: running {} threads", placement.n_parts(), placement.n_threads());
        }
        Ok(placement)
    }

    fn placement_for(&self, threads: usize) -> CliResult<TensorPlacement> {
        use blink_runtime::numa::Topology;
        match (self.numa.as_deref(), self.numa_nodes) {
            (_, Some(0)) => Err("--numa-nodes must be at least 1".into()),
            (_, Some(n)) if n > blink_model::forward::MAX_PARTS => Err(format!("--numa-nodes must be at most {}", blink_model::forward::MAX_PARTS).into()),
            (Some("off"), Some(_)) => Err("--numa-nodes needs --numa tp".into()),
            (_, Some(n)) => Ok(TensorPlacement::tensor_parallel(Topology::simulated(n), threads)),
            (Some("off"), None) => Ok(TensorPlacement::flat(threads)),
            (Some(_), None) => Ok(TensorPlacement::tensor_parallel(Topology::detect(), threads)),
            (None, None) => {
                let (placement, note) = TensorPlacement::automatic(Topology::detect(), threads);
                if let Some(note) = note {
                    eprintln!("note: {note}");
                }
                Ok(placement)
            }
        }
    }
}

pub fn parse_kv_type(s: &str) -> Result<KvType, String> {
    KvType::parse(s).ok_or_else(|| format!("unknown cache type '{s}' (use f16 or f32)"))
}

/// An `-n` value as llama.cpp takes it: -1 (until the end of generation) or -2 (until the
/// context is full) both mean no limit here, since generation stops at a full context.
pub fn max_tokens(n: i64) -> CliResult<Option<usize>> {
    match n {
        -2 | -1 => Ok(None),
        n => usize::try_from(n).map(Some).map_err(|_| format!("-n/--max-tokens must be -1, -2 or at least 0, got {n}").into()),
    }
}

/// Most compute threads a command takes: far past any CPU count (beyond it, threads only
/// fail to spawn).
const MAX_THREADS: usize = 4096;

/// A `-t` value: 0 or none means every available CPU.
pub fn resolve_threads(threads: Option<usize>) -> CliResult<usize> {
    match threads.filter(|&t| t > 0) {
        Some(t) if t > MAX_THREADS => Err(format!("-t/--threads must be at most {MAX_THREADS}, got {t}").into()),
        Some(t) => Ok(t),
        None => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
    }
}

impl ComputeArgs {
    pub fn threads(&self) -> CliResult<usize> {
        resolve_threads(self.threads)
    }

    /// A single-conversation session's sizes for `model`, whose rope is fitted to them.
    pub fn session_config(&self, model: &mut Model) -> CliResult<blink_engine::SessionConfig> {
        let n_ctx = self.ctx(model);
        model.fit_context(n_ctx);
        Ok(blink_engine::SessionConfig { n_ctx, n_threads: self.threads()?, n_batch: self.batch_size, kv_type: self.cache_type, swa_full: self.swa_full })
    }

    /// The context to run with, warning on stderr past the trained one.
    pub fn ctx(&self, model: &Model) -> usize {
        let ctx = model.cfg.context_for(self.ctx_size);
        if let Some(w) = model.cfg.context_warning(ctx) {
            eprintln!("blink: warning: {w}");
        }
        ctx
    }
}

/// Load the model `args` names, first fixing the kernel path and placement if `compute`
/// asks for them (flat on one thread otherwise); warnings go to stderr.
pub fn load_model(args: &ModelArgs, compute: Option<&ComputeArgs>) -> CliResult<Loaded> {
    let placement = match compute {
        Some(c) => {
            c.kernel.apply()?;
            c.numa.placement(c.threads()?)?
        }
        None => TensorPlacement::flat(1),
    };
    load_model_placed(args, &placement)
}

/// Load with an explicit placement (the kernel path must already be fixed).
pub fn load_model_placed(args: &ModelArgs, placement: &TensorPlacement) -> CliResult<Loaded> {
    let matrices = if NO_REPACK.load(std::sync::atomic::Ordering::Relaxed) { blink_model::Matrices::Mapped } else { blink_model::Matrices::Repacked };
    let share = blink_model::Share { windows: None, matrices };
    let loaded = Loaded::load_share(&args.path()?, placement, share)?;
    for w in &loaded.warnings {
        eprintln!("blink: warning: {w}");
    }
    Ok(loaded)
}

/// A `--seed` value: `None` for -1 (llama.cpp's "random").
#[derive(Clone, Copy, Debug)]
pub struct Seed(Option<u64>);

fn parse_seed(s: &str) -> Result<Seed, String> {
    match s.trim() {
        "-1" => Ok(Seed(None)),
        s => s.parse().map(|v| Seed(Some(v))).map_err(|_| format!("'{s}' is not a seed (0 to {}, or -1 for a random one)", u64::MAX)),
    }
}

/// Sampling options (llama.cpp's flag names).
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 (or less) means greedy.
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Random seed (default, or -1: a fresh one each run).
    #[arg(short = 's', long = "seed", allow_negative_numbers = true, value_parser = parse_seed)]
    pub seed: Option<Seed>,
    /// Keep only the k most likely tokens (0 or less: off).
    #[arg(long = "top-k", default_value_t = 40, allow_negative_numbers = true)]
    pub top_k: i64,
    /// Keep the smallest set of tokens whose probability reaches p (1: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than min-p times the most likely one (0: off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalise repeats of recent tokens (1: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties consider (0: none, -1: the whole context).
    #[arg(long = "repeat-last-n", default_value_t = 64, allow_negative_numbers = true)]
    pub repeat_last_n: i64,
    /// Subtract this per earlier occurrence of a token.
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Subtract this once if a token occurred before.
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
}

impl SamplingArgs {
    /// The checked parameters for a context of `n_ctx` tokens.
    pub fn params(&self, n_ctx: usize) -> CliResult<blink_engine::SamplingParams> {
        let repeat_last_n = match self.repeat_last_n {
            -1 => n_ctx,
            n => usize::try_from(n).map_err(|_| format!("--repeat-last-n must be -1 (the whole context) or more, got {n}"))?,
        };
        let params = blink_engine::SamplingParams {
            temperature: self.temp,
            top_k: usize::try_from(self.top_k).unwrap_or(0),
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: repeat_last_n.min(n_ctx),
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            seed: self.seed.and_then(|s| s.0),
        };
        params.validate()?;
        Ok(params)
    }
}

/// The prompt for a reply to `messages`, with the model's chat template.
pub fn chat_prompt(
    loaded: &Loaded,
    messages: &[blink_text::chat_template::ChatMessage],
) -> CliResult<Vec<u32>> {
    let template = loaded
        .template
        .as_ref()
        .ok_or("this model has no chat template; use --raw")?;
    Ok(template.prompt_tokens(&loaded.tokenizer, messages)?)
}

/// Speed summary line for stderr.
pub fn rate(tokens: usize, time: std::time::Duration) -> String {
    let ms = time.as_secs_f64() * 1e3;
    let tps = if ms > 0.0 { tokens as f64 * 1e3 / ms } else { 0.0 };
    format!("{tokens} tokens in {ms:.1} ms ({tps:.1} tok/s)")
}

/// The tokio runtime for HTTP and clients. Its threads run at a lower scheduling priority
/// than the compute threads, so on a machine where they share cores, request parsing,
/// detokenization and SSE writing wait for a barrier instead of stalling a forward pass.
pub fn io_runtime(name: &str) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(name)
        .on_thread_start(|| blink_runtime::affinity::lower_current_thread_priority(10))
        .build()
}

#[cfg(test)]
mod tests {
    use super::process_escapes;

    #[test]
    fn escapes_follow_llama_cpp() {
        for (text, want) in [
            ("a\\nb\\rc\\td", &b"a\nb\rc\td"[..]),
            ("\\'\\\"\\\\", b"'\"\\"),
            ("\\x41\\x7e\\xff", b"A~\xff"),
            // Not escapes: kept as written.
            ("\\q \\x4 \\xg1 end\\", b"\\q \\x4 \\xg1 end\\"),
            ("\\\\n", b"\\n"),
        ] {
            assert_eq!(process_escapes(text), want, "{text:?}");
        }
    }
}
