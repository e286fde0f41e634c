//! `blink info`: what a model file holds.

use std::collections::BTreeMap;

use blink_model::config::{RopeOrder, RopeScaling};

use crate::common::{load_model, CliResult, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Also list every metadata key (long arrays abbreviated).
    #[arg(long)]
    metadata: bool,
    /// Also describe these adapters as placed on the model: rank, targets and memory.
    #[command(flatten)]
    lora: crate::lora_args::LoraArgs,
    /// The kernel path and dot order whose routes to print.
    #[command(flatten)]
    kernel: crate::common::KernelArgs,
}

/// llama.cpp's names for `general.file_type`.
fn file_type_name(ft: u32) -> &'static str {
    match ft {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => "unknown",
    }
}

/// The file's type name (`general.file_type`), else the most common matrix type.
pub fn file_type_of(model: &blink_model::Model) -> String {
    match model.file().opt_u32("general.file_type") {
        Ok(Some(ft)) => file_type_name(ft).to_string(),
        _ => model.parts[0].layers.iter().flatten().next().map_or("unknown".into(), |l| l.wq.ty.name().to_string()),
    }
}

pub fn main(args: Args) -> CliResult {
    args.kernel.apply()?;
    let path = args.model.path()?;
    let loaded = load_model(&args.model, None)?;
    let m = &loaded.model;
    let file = m.file();
    let cfg = &m.cfg;
    let tok = &loaded.tokenizer;
    let adapters = describe_adapters(&args.lora, m)?;

    let mut types: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    let mut params = 0u64;
    for t in file.tensors() {
        let e = types.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
        params += t.n_elements();
    }
    let types: Vec<String> = types.iter().map(|(k, (n, b))| format!("{k} ×{n} ({:.1} MiB)", *b as f64 / 1048576.0)).collect();
    let file_type = file.opt_u32("general.file_type")?;

    outln!("file:            {} ({:.1} MiB, GGUF v{})", path.display(), file.file_size() as f64 / 1048576.0, file.version())?;
    outln!("name:            {}", cfg.name)?;
    outln!("architecture:    {}", cfg.arch.name())?;
    if let Some(ft) = file_type {
        outln!("file type:       {} ({ft})", file_type_name(ft))?;
    }
    outln!("parameters:      {:.1} M", params as f64 / 1e6)?;
    outln!("layers:          {}", cfg.n_layers)?;
    outln!("embedding:       {}", cfg.n_embd)?;
    outln!("feed-forward:    {}", cfg.n_ff)?;
    outln!("heads:           {} query, {} key/value, size {}", cfg.n_head, cfg.n_head_kv, cfg.head_dim)?;
    outln!("context (train): {}", cfg.n_ctx_train)?;
    outln!(
        "rope:            {} order, {} dims, base {}, scaling {}",
        match cfg.rope.order {
            RopeOrder::Normal => "normal",
            RopeOrder::NeoX => "neox",
        },
        cfg.rope.n_dims,
        cfg.rope.freq_base,
        match cfg.rope.scaling {
            RopeScaling::None => "none".to_string(),
            RopeScaling::Linear { factor } => format!("linear ×{factor}"),
            RopeScaling::Yarn { factor, original_ctx, .. } => format!("yarn ×{factor} (trained at {original_ctx})"),
        }
    )?;
    if let Some(sw) = &cfg.sliding {
        let local = sw.layers.iter().filter(|&&l| l).count();
        outln!("sliding window:  {} tokens on {local} of {} layers (rope base {}); their KV cache keeps a window (--swa-full: every position)", sw.window, cfg.n_layers, sw.rope.freq_base)?;
    }
    let mut blocks = Vec::new();
    if !cfg.pre_norms {
        blocks.push("no norms before attention and the FFN".to_string());
    }
    if cfg.post_norms {
        blocks.push("norms after attention and the FFN".to_string());
    }
    match cfg.qk_norm {
        Some(blink_model::config::QkNorm::PerHead) => blocks.push("Q/K norms per head".to_string()),
        Some(blink_model::config::QkNorm::Whole) => blocks.push("Q/K norms over the whole projection".to_string()),
        None => {}
    }
    if let Some(moe) = cfg.moe {
        blocks.push(format!("{} experts of width {}, {} per token", moe.n_expert, cfg.n_ff, moe.n_used));
    }
    if let Some(n) = cfg.no_rope_every {
        blocks.push(format!("no rope on every {n}th layer"));
    }
    if let Some(cap) = cfg.attn_softcap {
        blocks.push(format!("attention scores capped at {cap}"));
    }
    if let Some(cap) = cfg.logit_softcap {
        blocks.push(format!("logits capped at {cap}"));
    }
    if cfg.ffn_act != blink_model::config::FfnAct::Silu {
        blocks.push("GeGLU (tanh GELU)".to_string());
    }
    if !blocks.is_empty() {
        outln!("blocks:          {}", blocks.join(", "))?;
    }
    outln!("rms norm eps:    {:e}", cfg.norm_eps)?;
    outln!("tied output:     {}", file.tensor("output.weight").is_none())?;
    outln!("tensors:         {} — {}", file.tensors().len(), types.join(", "))?;
    outln!(
        "tokenizer:       {} ({}), {} tokens, bos {}, eos {}, add_bos {}, add_eos {}",
        tok.model_kind(),
        tok.pre().map_or_else(|| "no pre-tokenizer".to_string(), |p| format!("pre-tokenizer {p}")),
        tok.vocab_size(),
        id_or_none(tok.bos()),
        id_or_none(tok.eos()),
        tok.add_bos(),
        tok.add_eos()
    )?;
    outln!("chat template:   {}", if loaded.template.is_some() { "yes" } else { "none (chat uses ChatML, run completes the prompt as is)" })?;
    let features = blink_kernels::cpu::features();
    outln!("cpu features:    {}", if features.is_empty() { "none the kernels use".to_string() } else { features.join(" ") })?;
    let caches: Vec<String> = blink_kernels::cpu::caches()
        .iter()
        .filter(|c| c.kind != "Instruction")
        .map(|c| format!("L{}{} {} KiB (shared by {})", c.level, if c.kind == "Data" { "d" } else { "" }, c.bytes >> 10, c.shared_by))
        .collect();
    if !caches.is_empty() {
        outln!("caches:          {}", caches.join(", "))?;
    }
    let (isa, order) = (blink_kernels::cpu::active(), blink_kernels::order::active());
    outln!("kernel path:     {isa} (best on this CPU: {})", blink_kernels::cpu::Isa::best())?;
    outln!("dot order:       {}", order_line(isa, order))?;
    for (i, (ty, route)) in routes(file).iter().enumerate() {
        let head = if i == 0 { "routes:" } else { "" };
        outln!("{head:<17}{ty}: {route}")?;
    }
    outln!("tiling:          {}", tiling(file, &[cfg.n_embd, cfg.n_ff]))?;
    let topology = blink_runtime::numa::Topology::detect();
    outln!("numa topology:   {} node(s)", topology.n_nodes())?;
    for line in topology.to_string().lines() {
        outln!("  {line}")?;
    }
    for line in &adapters {
        outln!("{line}")?;
    }
    if args.metadata {
        outln!("metadata:")?;
        for (k, v) in file.metadata() {
            outln!("  {k} = {v}")?;
        }
    }
    Ok(())
}

/// The dot order, and for the llama order which llama.cpp build it reproduces and why.
pub(crate) fn order_line(isa: blink_kernels::cpu::Isa, order: blink_kernels::order::DotOrder) -> String {
    use blink_kernels::flavour;
    use blink_kernels::order::DotOrder;
    match order {
        DotOrder::Block => "block".to_string(),
        DotOrder::Llama => {
            let f = flavour::active();
            let why = if flavour::asked_for() {
                format!("--llama-flavour {f}")
            } else if isa == blink_kernels::cpu::Isa::Scalar {
                format!("the flavour of this CPU's best path, {}", blink_kernels::cpu::Isa::best())
            } else {
                format!("the flavour of the {isa} path")
            };
            format!("llama, as {} computes ({why})", f.build())
        }
    }
}

/// A line per `--lora` adapter as placed on `m`, or the first one's error: read before any
/// line is printed, so a bad adapter is the whole output.
fn describe_adapters(args: &crate::lora_args::LoraArgs, m: &blink_model::Model) -> CliResult<Vec<String>> {
    let mut lines = Vec::new();
    for (path, scale) in args.adapters()? {
        let err = |e: blink_model::lora::LoraError| format!("--lora {}", e.about(&path));
        let tensors = blink_model::lora::read(&path, &m.cfg).map_err(err)?;
        let placed = m.place_lora(&tensors).map_err(err)?;
        let targets: Vec<&str> = tensors.targets().iter().map(|t| t.short_name()).collect();
        lines.push(format!(
            "adapter:         {} ({}), rank {}, alpha {}, scale {scale}, targets {}, {:.1} MB of tensors, {:.1} MB held over {} part(s)",
            path.display(),
            match tensors.format {
                blink_model::lora::LoraFormat::Peft => "PEFT",
                blink_model::lora::LoraFormat::Gguf => "llama.cpp GGUF",
            },
            placed.max_rank(),
            placed.alpha(),
            targets.join(","),
            placed.tensor_bytes() as f64 / 1e6,
            placed.held_bytes() as f64 / 1e6,
            m.parts.len()
        ));
    }
    Ok(lines)
}

fn id_or_none(id: Option<u32>) -> String {
    id.map_or_else(|| "none".to_string(), |id| id.to_string())
}

/// How the products cut their activation rows into panels for this CPU's L2, for inputs
/// of each of `widths` columns to `file`'s first matrix type (as the active kernel path
/// and dot order hold a batch's rows), and the weight rows into blocks for its L3 and
/// chunks for its L1.
pub(crate) fn tiling(file: &blink_gguf::GgufFile, widths: &[usize]) -> String {
    use blink_kernels::gemm::tiling;
    let l2 = tiling::l2_bytes();
    let ty = routes(file).first().map_or(blink_gguf::GgmlType::Q8_0, |&(ty, _)| ty);
    let (isa, order) = (blink_kernels::cpu::active(), blink_kernels::order::active());
    let panels: Vec<String> = widths
        .iter()
        .filter_map(|&w| blink_kernels::gemm::batch_act_row_bytes(isa, order, ty, w).map(|b| (w, b)))
        .map(|(w, b)| format!("past {} rows of {w} columns, panels of {}", l2 / b, tiling::panel_rows(b, l2)))
        .collect();
    format!(
        "activation rows that overflow the L2 ({} KiB per core) go in panels of half of it: {}; then weight rows in blocks of half the L3 ({} KiB per core); k-quant rows, and on AVX2 weight groups too long for it, in chunks of half the L1 ({} KiB per core)",
        l2 >> 10,
        panels.join("; "),
        tiling::l3_bytes() >> 10,
        tiling::l1_bytes() >> 10
    )
}

/// Each matrix type in `file` (in type order) and the route its products take on the
/// active kernel path and dot order.
pub(crate) fn routes(file: &blink_gguf::GgufFile) -> Vec<(blink_gguf::GgmlType, String)> {
    let (isa, order) = (blink_kernels::cpu::active(), blink_kernels::order::active());
    let mut types: Vec<_> = file.tensors().iter().filter(|t| t.dims.len() >= 2).map(|t| t.ty).collect();
    types.sort_by_key(|t| t.id());
    types.dedup();
    types.into_iter().map(|ty| (ty, blink_kernels::gemm::route(isa, order, ty))).collect()
}
