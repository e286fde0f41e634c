//! synth_model: random-weight GGUF files of real model shapes, made without the network, for
//! speed measurements at the sizes people run (issue 49's matrix, `scripts/bench_matrix.py`).
//!
//! Owns: the shapes (hyper-parameters, GGUF keys and tensor names as llama.cpp's converter
//! writes them for Llama-3.2-1B, Qwen2.5-1.5B, Gemma-3-1B and Llama-3.1-8B), the tensor-type
//! mix of each preset (the types `llama-quantize` picks without an importance matrix, from
//! the rules of llama.cpp's src/llama-quant.cpp, re-expressed here), seeded random weights,
//! and streaming them to disk quantized by Blink's reference quantizers on every core.
//! The vocabulary (tokenizer metadata and chat template) is copied from another GGUF file,
//! the default model's unless `--vocab-from` names one, so the embedding and output
//! matrices have its row count.
//!
//! ```sh
//! cargo run --release -p blink-model --example synth_model -- --shape llama-1b --preset Q4_K_M -o llama-1b.Q4_K_M.gguf
//! ```
//! Flags: `--shape S`, `--preset P` or `--type T` (every matrix in type T, as
//! `llama-quantize --pure`), `--layers N` (the first N layers only), `--seed S`,
//! `--vocab-from FILE`, `--vocab N` (only the vocabulary's first N tokens and the merges
//! among them: a small LM head for quick checks, not a real shape), `--unique-rows N` (each
//! matrix's rows drawn from N random rows quantized once: the same shapes, types and bytes
//! per token, made in a fraction of the time, for checks), `-o OUT`, `--threads N`,
//! `--dry-run` (print each tensor's name, type and shape, write nothing), `--list`.
//!
//! The same arguments give the same bytes, whatever the thread count. The text such a model
//! writes is noise; its speed is a real model's of the same shape and mix.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Instant;

use blink_gguf::{GgmlType, GgufFile, GgufWriter, Value};

/// A model family's layout: which tensors a layer has beyond the common ones.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Family {
    /// Llama 3: llama3 rope factors in `rope_freqs.weight`.
    Llama,
    /// Qwen2: Q, K and V biases.
    Qwen2,
    /// Gemma 3: Q/K norms, post-attention and post-FFN norms, sliding-window layers.
    Gemma3,
}

/// Llama 3's rope scaling, which the converter turns into `rope_freqs.weight`.
#[derive(Clone, Copy, Debug)]
struct Llama3Rope {
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_ctx: f64,
}

/// A real model's hyper-parameters, as its config.json gives them.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub name: &'static str,
    /// The model whose body this is.
    pub model: &'static str,
    family: Family,
    arch: &'static str,
    pub n_embd: usize,
    pub n_layers: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    ctx: u32,
    rope_theta: f32,
    rms_eps: f32,
    /// No `output.weight`: the LM head is the token embedding.
    pub tied: bool,
    /// config.json names `head_dim`, so the converter writes the key and value lengths.
    head_dim_in_config: bool,
    llama3_rope: Option<Llama3Rope>,
    /// Gemma 3's local window (every sixth layer global, llama.cpp's default for the family).
    sliding_window: Option<u32>,
}

pub const SHAPES: [Shape; 4] = [
    Shape {
        name: "llama-1b",
        model: "Llama-3.2-1B",
        family: Family::Llama,
        arch: "llama",
        n_embd: 2048,
        n_layers: 16,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 64,
        n_ff: 8192,
        ctx: 131072,
        rope_theta: 500000.0,
        rms_eps: 1e-5,
        tied: true,
        head_dim_in_config: true,
        llama3_rope: Some(Llama3Rope { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_ctx: 8192.0 }),
        sliding_window: None,
    },
    Shape {
        name: "qwen2-1.5b",
        model: "Qwen2.5-1.5B-Instruct",
        family: Family::Qwen2,
        arch: "qwen2",
        n_embd: 1536,
        n_layers: 28,
        n_head: 12,
        n_head_kv: 2,
        head_dim: 128,
        n_ff: 8960,
        ctx: 32768,
        rope_theta: 1000000.0,
        rms_eps: 1e-6,
        tied: true,
        head_dim_in_config: false,
        llama3_rope: None,
        sliding_window: None,
    },
    Shape {
        name: "gemma3-1b",
        model: "Gemma-3-1B",
        family: Family::Gemma3,
        arch: "gemma3",
        n_embd: 1152,
        n_layers: 26,
        n_head: 4,
        n_head_kv: 1,
        head_dim: 256,
        n_ff: 6912,
        ctx: 32768,
        rope_theta: 1000000.0,
        rms_eps: 1e-6,
        tied: true,
        head_dim_in_config: true,
        llama3_rope: None,
        sliding_window: Some(512),
    },
    Shape {
        name: "llama-8b",
        model: "Llama-3.1-8B",
        family: Family::Llama,
        arch: "llama",
        n_embd: 4096,
        n_layers: 32,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_ff: 14336,
        ctx: 131072,
        rope_theta: 500000.0,
        rms_eps: 1e-5,
        tied: false,
        head_dim_in_config: false,
        llama3_rope: Some(Llama3Rope { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_ctx: 8192.0 }),
        sliding_window: None,
    },
];

/// What goes in the file's matrices: a `llama-quantize` preset (its `general.file_type`
/// and default type), F16 as the converter writes it, or one type for every matrix.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Preset {
    Q4_0,
    Q8_0,
    Q4KM,
    Q5KM,
    Q6K,
    IQ4XS,
    F16,
    /// Every matrix in this type (`llama-quantize --pure`): no mix, fallbacks only.
    Pure(GgmlType),
}

pub const PRESETS: [(&str, Preset); 7] = [
    ("Q4_0", Preset::Q4_0),
    ("Q4_K_M", Preset::Q4KM),
    ("Q5_K_M", Preset::Q5KM),
    ("Q6_K", Preset::Q6K),
    ("Q8_0", Preset::Q8_0),
    ("IQ4_XS", Preset::IQ4XS),
    ("F16", Preset::F16),
];

impl Preset {
    /// The type a matrix gets when no rule says otherwise (llama.cpp's default for the
    /// file type).
    fn base(self) -> GgmlType {
        use GgmlType as T;
        match self {
            Preset::Q4_0 => T::Q4_0,
            Preset::Q8_0 => T::Q8_0,
            Preset::Q4KM => T::Q4_K,
            Preset::Q5KM => T::Q5_K,
            Preset::Q6K => T::Q6_K,
            Preset::IQ4XS => T::IQ4_XS,
            Preset::F16 => T::F16,
            Preset::Pure(t) => t,
        }
    }

    /// `general.file_type`: llama.cpp's `llama_ftype` (for a pure type, the file type whose
    /// default it is).
    fn file_type(self) -> u32 {
        use GgmlType as T;
        match self {
            Preset::Q4_0 => 2,
            Preset::Q8_0 => 7,
            Preset::Q4KM => 15,
            Preset::Q5KM => 17,
            Preset::Q6K => 18,
            Preset::IQ4XS => 30,
            Preset::F16 => 1,
            Preset::Pure(t) => match t {
                T::F32 => 0,
                T::F16 => 1,
                T::Q4_0 => 2,
                T::Q4_1 => 3,
                T::Q8_0 => 7,
                T::Q5_0 => 8,
                T::Q5_1 => 9,
                T::Q2_K => 10,
                T::Q3_K => 11,
                T::Q4_K => 14,
                T::Q5_K => 16,
                T::Q6_K => 18,
                T::IQ2_XXS => 19,
                T::IQ2_XS => 20,
                T::IQ3_XXS => 23,
                T::IQ4_NL => 25,
                T::IQ3_S => 26,
                T::IQ2_S => 29,
                T::IQ4_XS => 30,
                T::BF16 => 32,
                T::TQ1_0 => 36,
                T::TQ2_0 => 37,
                T::MXFP4 => 38,
                T::Q8_1 | T::Q8_K => unreachable!("refused when parsed"),
            },
        }
    }
}

/// How a tensor's values are made.
#[derive(Clone, Debug)]
enum Init {
    /// Roughly Gaussian, mean 0, this standard deviation.
    Normal(f32),
    /// Near 1 (norm weights, stored as llama.cpp multiplies by them).
    Norm,
    /// These values.
    Values(Vec<f32>),
}

/// One tensor of the file.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// The layer it belongs to, if any.
    pub layer: Option<usize>,
    init: Init,
}

/// Matrices' standard deviation; biases'.
const WEIGHT_STD: f32 = 0.02;
const BIAS_STD: f32 = 0.02;
/// Norm weights' spread around 1.
const NORM_STD: f32 = 0.02;

/// Every tensor of `shape` with `n_layers` layers and a vocabulary of `vocab`, with its
/// type under `preset`, in the order `llama-quantize` writes them (layer by layer, by name
/// within a layer, the rest first).
pub fn plan(shape: &Shape, n_layers: usize, vocab: usize, preset: Preset) -> Vec<TensorSpec> {
    let (d, hd, ff) = (shape.n_embd as u64, shape.head_dim as u64, shape.n_ff as u64);
    let (q, kv) = (shape.n_head as u64 * hd, shape.n_head_kv as u64 * hd);
    let mut out = Vec::new();
    let mut add = |name: String, dims: Vec<u64>, layer: Option<usize>, init: Init| {
        out.push(TensorSpec { name, dims, ty: GgmlType::F32, layer, init });
    };
    let w = Init::Normal(WEIGHT_STD);
    add("token_embd.weight".into(), vec![d, vocab as u64], None, w.clone());
    add("output_norm.weight".into(), vec![d], None, Init::Norm);
    if !shape.tied {
        add("output.weight".into(), vec![d, vocab as u64], None, w.clone());
    }
    if let Some(r) = shape.llama3_rope {
        add("rope_freqs.weight".into(), vec![hd / 2], None, Init::Values(llama3_rope_factors(r, shape.rope_theta as f64, shape.head_dim)));
    }
    for l in 0..n_layers {
        let n = |s: &str| format!("blk.{l}.{s}");
        let at = Some(l);
        add(n("attn_norm.weight"), vec![d], at, Init::Norm);
        add(n("attn_q.weight"), vec![d, q], at, w.clone());
        add(n("attn_k.weight"), vec![d, kv], at, w.clone());
        add(n("attn_v.weight"), vec![d, kv], at, w.clone());
        add(n("attn_output.weight"), vec![q, d], at, w.clone());
        add(n("ffn_norm.weight"), vec![d], at, Init::Norm);
        add(n("ffn_gate.weight"), vec![d, ff], at, w.clone());
        add(n("ffn_up.weight"), vec![d, ff], at, w.clone());
        add(n("ffn_down.weight"), vec![ff, d], at, w.clone());
        match shape.family {
            Family::Llama => {}
            Family::Qwen2 => {
                add(n("attn_q.bias"), vec![q], at, Init::Normal(BIAS_STD));
                add(n("attn_k.bias"), vec![kv], at, Init::Normal(BIAS_STD));
                add(n("attn_v.bias"), vec![kv], at, Init::Normal(BIAS_STD));
            }
            Family::Gemma3 => {
                add(n("attn_q_norm.weight"), vec![hd], at, Init::Norm);
                add(n("attn_k_norm.weight"), vec![hd], at, Init::Norm);
                add(n("post_attention_norm.weight"), vec![d], at, Init::Norm);
                add(n("post_ffw_norm.weight"), vec![d], at, Init::Norm);
            }
        }
    }
    // llama.cpp's loader orders tensors by layer (none first), then by name.
    out.sort_by(|a, b| (a.layer.map_or(-1, |l| l as i64), &a.name).cmp(&(b.layer.map_or(-1, |l| l as i64), &b.name)));
    let mix = Mix { preset, n_layers, n_gqa: shape.n_head / shape.n_head_kv, tied: shape.tied };
    for t in &mut out {
        t.ty = mix.type_of(t);
    }
    out
}

/// Llama 3's per-dimension rope factors, as the converter computes them.
fn llama3_rope_factors(r: Llama3Rope, base: f64, head_dim: usize) -> Vec<f32> {
    let low_wavelen = r.original_ctx / r.low_freq_factor;
    let high_wavelen = r.original_ctx / r.high_freq_factor;
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / base.powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let factor = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                r.factor
            } else {
                let smooth = (r.original_ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
                1.0 / ((1.0 - smooth) / r.factor + smooth)
            };
            factor as f32
        })
        .collect()
}

/// The type `llama-quantize` gives each tensor under a preset, without an importance matrix.
struct Mix {
    preset: Preset,
    n_layers: usize,
    /// Query heads per key/value head.
    n_gqa: usize,
    tied: bool,
}

impl Mix {
    fn type_of(&self, t: &TensorSpec) -> GgmlType {
        use GgmlType as T;
        // Vectors (norms, biases, rope factors) stay as the converter writes them: F32.
        if t.dims.len() < 2 {
            return T::F32;
        }
        let wanted = match self.preset {
            // The converter's F16 file: every matrix F16.
            Preset::F16 => return T::F16,
            Preset::Pure(ty) => ty,
            _ => self.mixed(t),
        };
        fit_rows(wanted, t.dims[0] as usize)
    }

    /// The preset's rules: more bits for the LM head (and a tied embedding, which is it),
    /// for some layers' V and FFN-down projections.
    fn mixed(&self, t: &TensorSpec) -> GgmlType {
        use GgmlType as T;
        let base = self.preset.base();
        let layer = t.layer.unwrap_or(0);
        let cols = t.dims[0] as usize;
        let role = t.name.split('.').rev().nth(1).unwrap_or("");
        let is_head = t.name == "output.weight" || (self.tied && t.name == "token_embd.weight");
        if is_head {
            // Q8_0 where the base type's blocks do not fit a row (so no k-quant could).
            return if !cols.is_multiple_of(base.block_size()) || base == T::Q8_0 { T::Q8_0 } else { T::Q6_K };
        }
        match (role, self.preset) {
            ("attn_v", Preset::IQ4XS) if self.n_gqa >= 4 => T::Q5_K,
            ("attn_v", Preset::Q4KM | Preset::Q5KM) if more_bits(layer, self.n_layers) => T::Q6_K,
            ("ffn_down", Preset::Q4KM | Preset::Q5KM) if more_bits(layer, self.n_layers) => T::Q6_K,
            ("ffn_down", Preset::IQ4XS) if layer < self.n_layers / 8 => T::Q5_K,
            _ => base,
        }
    }
}

/// The V and FFN-down layers the K-quant mixes give more bits: the first and last eighth,
/// and every third layer between.
fn more_bits(layer: usize, n_layers: usize) -> bool {
    let (first, last) = (n_layers / 8, 7 * n_layers / 8);
    layer < first || layer >= last || (layer - first) % 3 == 2
}

/// `ty`, or what stands in for it when rows of `cols` elements are not whole blocks of it:
/// a 32-element type of about the same size, else F16.
fn fit_rows(ty: GgmlType, cols: usize) -> GgmlType {
    use GgmlType as T;
    if cols.is_multiple_of(ty.block_size()) {
        return ty;
    }
    let smaller = match ty {
        T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ3_XXS | T::IQ3_S | T::IQ4_XS => T::IQ4_NL,
        T::Q2_K | T::Q3_K | T::TQ1_0 | T::TQ2_0 => T::Q4_0,
        T::Q4_K => T::Q5_0,
        T::Q5_K => T::Q5_1,
        T::Q6_K => T::Q8_0,
        other => other,
    };
    if cols.is_multiple_of(smaller.block_size()) {
        smaller
    } else {
        T::F16
    }
}

/// Command-line options.
struct Options {
    shape: Shape,
    preset: Preset,
    layers: usize,
    seed: u64,
    vocab_from: Option<PathBuf>,
    /// Keep only this many tokens of the vocabulary.
    vocab: Option<usize>,
    /// Draw each matrix's rows from this many distinct rows.
    unique_rows: Option<usize>,
    out: Option<PathBuf>,
    threads: usize,
    dry_run: bool,
}

const USAGE: &str = "usage: synth_model --shape SHAPE (--preset P | --type T) [--layers N] [--seed S] [--vocab-from FILE.gguf] [--vocab N] [--unique-rows N] [--threads N] (-o OUT.gguf | --dry-run) | --list";

fn parse_type(name: &str) -> Result<GgmlType, String> {
    let ty = GgmlType::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(name));
    match ty {
        Some(GgmlType::Q8_1 | GgmlType::Q8_K) => Err(format!("{name} is an activation type, not one for weights")),
        Some(t) => Ok(t),
        None => Err(format!("unknown type '{name}' (types: {})", GgmlType::ALL.map(|t| t.name()).join(", "))),
    }
}

fn parse_args(args: &[String]) -> Result<Option<Options>, String> {
    let (mut shape, mut preset, mut layers, mut seed) = (None, None, None, 1u64);
    let (mut vocab_from, mut vocab, mut out, mut threads, mut dry_run) = (None, None, None, None, false);
    let mut unique_rows = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"));
        let number = |v: &String| v.parse::<u64>().map_err(|_| format!("{flag} takes a whole number, not '{v}'"));
        match flag.as_str() {
            "--shape" => {
                let v = value()?;
                let names: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
                shape = Some(*SHAPES.iter().find(|s| s.name == v).ok_or_else(|| format!("unknown shape '{v}' (shapes: {})", names.join(", ")))?);
            }
            "--preset" => {
                let v = value()?;
                let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
                let p = PRESETS.iter().find(|p| p.0.eq_ignore_ascii_case(v)).ok_or_else(|| format!("unknown preset '{v}' (presets: {}; or --type T for one type throughout)", names.join(", ")))?;
                preset = Some(p.1);
            }
            "--type" => preset = Some(Preset::Pure(parse_type(value()?)?)),
            "--layers" => layers = Some(number(value()?)? as usize),
            "--seed" => seed = number(value()?)?,
            "--vocab-from" => vocab_from = Some(PathBuf::from(value()?)),
            "--vocab" => vocab = Some(number(value()?)? as usize),
            "--unique-rows" => unique_rows = Some(number(value()?)?.max(1) as usize),
            "-o" | "--out" => out = Some(PathBuf::from(value()?)),
            "--threads" => threads = Some(number(value()?)? as usize),
            "--dry-run" => dry_run = true,
            "--list" => {
                for s in &SHAPES {
                    println!("{}: {} ({}, {} layers, dim {}, {}/{} heads of {}, FFN {}{})", s.name, s.model, s.arch, s.n_layers, s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_ff, if s.tied { ", tied embeddings" } else { "" });
                }
                println!("presets: {}", PRESETS.map(|p| p.0).join(", "));
                return Ok(None);
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument '{other}'\n{USAGE}")),
        }
    }
    let shape = shape.ok_or_else(|| format!("--shape is required\n{USAGE}"))?;
    let preset = preset.ok_or_else(|| format!("--preset or --type is required\n{USAGE}"))?;
    let layers = layers.unwrap_or(shape.n_layers);
    if layers == 0 || layers > shape.n_layers {
        return Err(format!("--layers must be 1 to {} for {}", shape.n_layers, shape.name));
    }
    if out.is_none() && !dry_run {
        return Err(format!("-o OUT.gguf (or --dry-run) is required\n{USAGE}"));
    }
    let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    Ok(Some(Options { shape, preset, layers, seed, vocab_from, vocab, unique_rows, out, threads, dry_run }))
}

/// Runs the generator on `args` (the command line without the program name).
pub fn run(args: &[String]) -> Result<(), String> {
    let Some(opts) = parse_args(args)? else { return Ok(()) };
    let vocab_path = match &opts.vocab_from {
        Some(p) => p.clone(),
        None => blink_model::fetch::ensure_default_model().map_err(|e| format!("the default model (the vocabulary's source): {e}"))?,
    };
    let vocab_file = GgufFile::open(&vocab_path).map_err(|e| format!("{}: {e}", vocab_path.display()))?;
    let tokenizer = vocabulary(&vocab_file, opts.vocab).map_err(|e| format!("{}: {e}", vocab_path.display()))?;
    let vocab = tokenizer.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").and_then(|(_, v)| if let Value::Array(a) = v { Some(a.len()) } else { None }).ok_or_else(|| format!("{}: no tokenizer.ggml.tokens", vocab_path.display()))?;
    let tensors = plan(&opts.shape, opts.layers, vocab, opts.preset);
    if opts.dry_run {
        for t in &tensors {
            println!("{} {} {:?}", t.name, t.ty, t.dims);
        }
        return Ok(());
    }
    let out = opts.out.as_ref().expect("checked when parsed");
    let mut w = GgufWriter::new();
    add_metadata(&mut w, &opts, vocab, tokenizer).map_err(|e| e.to_string())?;
    for t in &tensors {
        w.declare_tensor(t.name.clone(), t.ty, &t.dims).map_err(|e| e.to_string())?;
    }
    // Written beside the target and renamed, so a file at OUT is always whole.
    let partial = out.with_extension("gguf.partial");
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let start = Instant::now();
    let mut next = 0;
    w.write_with(&partial, |name, sink| {
        let t = &tensors[next];
        assert_eq!(t.name, name, "tensors are asked for in the order declared");
        next += 1;
        write_tensor(t, opts.seed, opts.threads, opts.unique_rows, sink)
    })
    .map_err(|e| e.to_string())?;
    std::fs::rename(&partial, out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut types: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for t in &tensors {
        let e = types.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.ty.row_bytes(t.dims[0]).unwrap_or(0) * t.dims[1..].iter().product::<u64>();
    }
    let types: Vec<String> = types.iter().map(|(k, (n, b))| format!("{k} ×{n} ({:.1} MiB)", *b as f64 / 1048576.0)).collect();
    let size = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    eprintln!("synth_model: wrote {} ({:.1} MiB, {} layers, {}) in {:.1?}: {}", out.display(), size as f64 / 1048576.0, opts.layers, opts.shape.model, start.elapsed(), types.join(", "));
    Ok(())
}

/// The keys llama.cpp's converter writes for the shape (as `llama-quantize` leaves them),
/// then the vocabulary's (`tokenizer`, with its `n_vocab` tokens).
fn add_metadata(w: &mut GgufWriter, opts: &Options, n_vocab: usize, tokenizer: Vec<(String, Value)>) -> Result<(), blink_gguf::GgufError> {
    let s = &opts.shape;
    let key = |k: &str| format!("{}.{k}", s.arch);
    w.add("general.architecture", s.arch)?;
    w.add("general.type", "model")?;
    let layers = if opts.layers < s.n_layers { format!(", first {} of {} layers", opts.layers, s.n_layers) } else { String::new() };
    w.add("general.name", format!("{} shape, random weights (seed {}{layers})", s.model, opts.seed))?;
    w.add(key("block_count"), Value::U32(opts.layers as u32))?;
    w.add(key("context_length"), Value::U32(s.ctx))?;
    w.add(key("embedding_length"), Value::U32(s.n_embd as u32))?;
    w.add(key("feed_forward_length"), Value::U32(s.n_ff as u32))?;
    w.add(key("attention.head_count"), Value::U32(s.n_head as u32))?;
    w.add(key("attention.head_count_kv"), Value::U32(s.n_head_kv as u32))?;
    w.add(key("rope.freq_base"), Value::F32(s.rope_theta))?;
    w.add(key("attention.layer_norm_rms_epsilon"), Value::F32(s.rms_eps))?;
    if s.head_dim_in_config {
        w.add(key("attention.key_length"), Value::U32(s.head_dim as u32))?;
        w.add(key("attention.value_length"), Value::U32(s.head_dim as u32))?;
    }
    match s.family {
        Family::Llama => {
            w.add(key("vocab_size"), Value::U32(n_vocab as u32))?;
            w.add(key("rope.dimension_count"), Value::U32(s.head_dim as u32))?;
        }
        Family::Qwen2 => {}
        Family::Gemma3 => {
            w.add(key("attention.sliding_window"), Value::U32(s.sliding_window.expect("Gemma 3 has a window")))?;
            w.add(key("rope.freq_base_swa"), Value::F32(10000.0))?;
        }
    }
    w.add("general.file_type", Value::U32(opts.preset.file_type()))?;
    w.add("general.quantization_version", Value::U32(2))?;
    for (k, v) in tokenizer {
        w.add(k, v)?;
    }
    Ok(())
}

/// The `tokenizer.*` entries of `file` (chat template included), cut to the first `keep`
/// tokens if asked: the per-token arrays shortened, only the merges whose two parts and
/// result are among the tokens kept, and every special token kept.
fn vocabulary(file: &GgufFile, keep: Option<usize>) -> Result<Vec<(String, Value)>, String> {
    let mut entries: Vec<(String, Value)> = file.metadata().iter().filter(|(k, _)| k.starts_with("tokenizer.")).cloned().collect();
    let Some(keep) = keep else { return Ok(entries) };
    let tokens = file.get_array("tokenizer.ggml.tokens").map_err(|e| e.to_string())?;
    let blink_gguf::Array::String(tokens) = tokens else { return Err("tokenizer.ggml.tokens is not an array of strings".into()) };
    if keep == 0 || keep > tokens.len() {
        return Err(format!("--vocab must be 1 to the vocabulary's {} tokens", tokens.len()));
    }
    let kept: std::collections::HashSet<&str> = tokens[..keep].iter().map(String::as_str).collect();
    for (k, v) in &mut entries {
        match (k.as_str(), v) {
            ("tokenizer.ggml.merges", Value::Array(blink_gguf::Array::String(merges))) => merges.retain(|m| {
                m.split_once(' ').is_some_and(|(l, r)| kept.contains(l) && kept.contains(r) && kept.contains(format!("{l}{r}").as_str()))
            }),
            ("tokenizer.ggml.tokens" | "tokenizer.ggml.token_type" | "tokenizer.ggml.scores", Value::Array(a)) => truncate(a, keep),
            (k, v) if k.ends_with("_token_id") => {
                let id = match v {
                    Value::U32(id) => *id as usize,
                    Value::I32(id) => *id as usize,
                    _ => 0,
                };
                if id >= keep {
                    return Err(format!("--vocab {keep} would drop {k} = {id}"));
                }
            }
            _ => {}
        }
    }
    Ok(entries)
}

/// Shortens a per-token array to its first `n` entries.
fn truncate(a: &mut blink_gguf::Array, n: usize) {
    use blink_gguf::Array as A;
    match a {
        A::String(v) => v.truncate(n),
        A::I32(v) => v.truncate(n),
        A::F32(v) => v.truncate(n),
        A::U32(v) => v.truncate(n),
        A::U8(v) => v.truncate(n),
        _ => {}
    }
}

/// Bytes of output made in one go: each thread quantizes a share of these rows, then they
/// are written while nothing else is held.
const CHUNK_BYTES: usize = 32 << 20;

/// Makes, quantizes and writes tensor `t`, a chunk of rows at a time, each chunk's rows
/// shared among `threads` threads; with `unique`, its rows are copies of that many rows
/// made once, each row's pick a function of the seed and its index.
fn write_tensor(t: &TensorSpec, seed: u64, threads: usize, unique: Option<usize>, sink: &mut dyn Write) -> io::Result<()> {
    let cols = t.dims[0] as usize;
    let rows = t.dims[1..].iter().product::<u64>() as usize;
    let row_bytes = t.ty.row_bytes(cols as u64).expect("the planned type fits the rows") as usize;
    let tensor_seed = mix64(seed ^ fnv1a(t.name.as_bytes()));
    let chunk_rows = (CHUNK_BYTES / row_bytes).clamp(1, rows.max(1));
    let pool = match unique {
        Some(n) if n < rows => {
            let mut pool = vec![0u8; n * row_bytes];
            quantize_rows(t, tensor_seed, 0, threads, &mut pool).map_err(io::Error::other)?;
            Some((n, pool))
        }
        _ => None,
    };
    let mut buf = vec![0u8; chunk_rows * row_bytes];
    for first in (0..rows).step_by(chunk_rows) {
        let n = chunk_rows.min(rows - first);
        let out = &mut buf[..n * row_bytes];
        match &pool {
            Some((size, pool)) => {
                for (r, dst) in out.chunks_mut(row_bytes).enumerate() {
                    let pick = (mix64(tensor_seed ^ (first + r) as u64) % *size as u64) as usize;
                    dst.copy_from_slice(&pool[pick * row_bytes..(pick + 1) * row_bytes]);
                }
            }
            None => quantize_rows(t, tensor_seed, first, threads, out).map_err(io::Error::other)?,
        }
        sink.write_all(out)?;
    }
    Ok(())
}

/// Rows `first..` of `t` (as many as `out` holds), quantized into `out` by `threads`
/// threads, each taking a contiguous share.
fn quantize_rows(t: &TensorSpec, tensor_seed: u64, first: usize, threads: usize, out: &mut [u8]) -> Result<(), String> {
    let cols = t.dims[0] as usize;
    let row_bytes = t.ty.row_bytes(cols as u64).expect("the planned type fits the rows") as usize;
    let per_thread = (out.len() / row_bytes).div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = out
            .chunks_mut(per_thread * row_bytes)
            .enumerate()
            .map(|(i, part)| {
                let from = first + i * per_thread;
                s.spawn(move || -> Result<(), String> {
                    let mut values = vec![0f32; cols];
                    for (r, dst) in part.chunks_mut(row_bytes).enumerate() {
                        fill_row(&t.init, tensor_seed, from + r, &mut values);
                        blink_kernels::quant::quantize_weights(t.ty, &values, dst).map_err(|e| format!("{}: {e}", t.name))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("a quantizing thread panicked"))
    })
}

/// Row `row`'s values: a function of the tensor's seed and the row alone.
fn fill_row(init: &Init, tensor_seed: u64, row: usize, out: &mut [f32]) {
    let mut state = mix64(tensor_seed.wrapping_add((row as u64).wrapping_mul(0xD1B5_4A32_D192_ED03)));
    let mut gauss = || {
        // Irwin-Hall: four 16-bit uniforms summed, centred and scaled to variance 1.
        let r = splitmix64(&mut state);
        let sum = (r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48);
        (sum as f32 - 131070.0) * (1.0 / 37837.23)
    };
    match init {
        Init::Normal(std) => out.iter_mut().for_each(|v| *v = std * gauss()),
        Init::Norm => out.iter_mut().for_each(|v| *v = 1.0 + NORM_STD * gauss()),
        Init::Values(values) => out.copy_from_slice(&values[row * out.len()..(row + 1) * out.len()]),
    }
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    mix64(*state)
}

/// splitmix64's finaliser: a bijective scramble of 64 bits.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a, to give each tensor name its own stream.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[allow(dead_code)]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args) {
        eprintln!("synth_model: {e}");
        std::process::exit(2);
    }
}
