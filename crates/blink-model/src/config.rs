//! Hyper-parameters of a model, read and checked from GGUF metadata.
//!
//! One `ModelConfig` describes every supported architecture; the per-architecture
//! differences (rope order, biases, q/k norms) are plain fields, not separate types.

use blink_gguf::{GgufError, GgufFile, Value};

use crate::ModelError;

/// The transformer families Blink can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1/2/3, Mistral, SmolLM and friends.
    Llama,
    /// Qwen2: Llama plus biases on Q, K and V.
    Qwen2,
    /// Qwen3: Llama plus RMS norms on Q and K per head.
    Qwen3,
    /// Gemma 3: embeddings scaled by √d, Q/K norms, norms after attention and the FFN
    /// as well as before, GeGLU, and local sliding-window layers between global ones.
    Gemma3,
    /// Gemma 2: Gemma 3's blocks without Q/K norms, with soft-capped attention scores
    /// and logits, and every other layer local.
    Gemma2,
    /// Granite: Llama with multipliers on the embeddings, the blocks' outputs, the
    /// attention scores and the logits.
    Granite,
    /// SmolLM3: Llama whose every fourth layer has no rope.
    Smollm3,
    /// OLMo 2: norms after each block instead of before, RMS norms over the whole Q and
    /// K projections, NeoX rope, an LM head of its own.
    Olmo2,
    /// Phi-3: Llama with fused Q/K/V and gate/up tensors, NeoX rope with per-dimension
    /// factors for short and long contexts.
    Phi3,
    /// Qwen3-MoE: Qwen3's attention, and a mixture of experts for every FFN.
    Qwen3Moe,
}

impl Arch {
    fn from_name(name: &str) -> Result<Arch, ModelError> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "gemma2" => Ok(Arch::Gemma2),
            "gemma3" => Ok(Arch::Gemma3),
            "granite" => Ok(Arch::Granite),
            "smollm3" => Ok(Arch::Smollm3),
            "olmo2" => Ok(Arch::Olmo2),
            "phi3" => Ok(Arch::Phi3),
            "qwen3moe" => Ok(Arch::Qwen3Moe),
            other => Err(ModelError::Unsupported(format!(
                "architecture '{other}' (supported: llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, granite, smollm3, olmo2, phi3)"
            ))),
        }
    }

    /// The GGUF metadata prefix and display name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Granite => "granite",
            Arch::Smollm3 => "smollm3",
            Arch::Olmo2 => "olmo2",
            Arch::Phi3 => "phi3",
            Arch::Qwen3Moe => "qwen3moe",
        }
    }
}

/// The FFN's gated activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    /// SwiGLU: `silu(gate) · up`.
    Silu,
    /// GeGLU with the tanh approximation of GELU (through llama.cpp's f16 table).
    GeluTanh,
}

/// A mixture of experts in place of every layer's FFN: a router scores `n_expert` experts
/// per token (softmax), the `n_used` best run (each a SwiGLU FFN of `ModelConfig::n_ff`),
/// and their outputs are summed weighted by their scores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moe {
    pub n_expert: usize,
    pub n_used: usize,
    /// The chosen experts' scores are divided by their sum (Mixtral, Qwen3-MoE).
    pub norm_weights: bool,
    /// The scores are then multiplied by this (`expert_weights_scale`), if any.
    pub weights_scale: Option<f32>,
}

/// RMS norms on the queries and keys before rope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    /// One norm per head, its weight one head wide (Qwen3, Gemma 3).
    PerHead,
    /// One norm over the whole projection, its weight as wide (OLMo 2).
    Whole,
}

/// Local attention on some layers: a query sees only the last `window` positions (its
/// own included), with rope of its own base.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    pub window: usize,
    /// Per layer, whether it is local.
    pub layers: Vec<bool>,
    pub rope: RopeConfig,
}

/// How rotary position embedding pairs dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeOrder {
    /// Adjacent pairs (2i, 2i+1): llama.cpp's "normal" order, used with permuted Q/K weights.
    Normal,
    /// Halves (i, i + d/2): GPT-NeoX order.
    NeoX,
}

/// Context-extension scaling declared by the file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear { factor: f32 },
    /// YaRN: interpolation blended with extrapolation per dimension.
    Yarn {
        factor: f32,
        original_ctx: u32,
        ext_factor: f32,
        beta_fast: f32,
        beta_slow: f32,
    },
}

/// Rotary embedding parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    pub order: RopeOrder,
    /// Number of leading head dimensions rotated.
    pub n_dims: usize,
    pub freq_base: f32,
    pub scaling: RopeScaling,
    /// Cosines and sines are multiplied by this (`rope.scaling.attn_factor`, 1 if absent;
    /// Phi-3's long-context files set it).
    pub attn_factor: f32,
    /// The context the per-dimension frequency factors switch from short to long at (the
    /// file's `rope.scaling.original_context_length`, else the trained context).
    pub original_ctx: usize,
}

/// Shape and numerics of a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub name: String,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    pub norm_eps: f32,
    pub rope: RopeConfig,
    pub vocab_size: usize,
    /// RMS norms on each block's input (all but OLMo 2).
    pub pre_norms: bool,
    pub qk_norm: Option<QkNorm>,
    /// Layers `l` with `(l + 1) % n == 0` have no rope (SmolLM3: every fourth).
    pub no_rope_every: Option<usize>,
    /// Attention scores pass through `cap · tanh(score / cap)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Experts in place of the FFN (`n_ff` is then an expert's width).
    pub moe: Option<Moe>,
    /// Token embeddings are multiplied by this (Gemma: √n_embd).
    pub embd_scale: Option<f32>,
    /// RMS norms on the attention and FFN outputs before they join the residual stream.
    pub post_norms: bool,
    pub ffn_act: FfnAct,
    /// Queries are multiplied by this after rope and scores left unscaled (Gemma, as
    /// llama.cpp computes it); `None`: scores scaled by 1/√head_dim.
    pub query_scale: Option<f32>,
    pub sliding: Option<SlidingWindow>,
    /// Logits pass through `cap · tanh(logit / cap)`.
    pub logit_softcap: Option<f32>,
    /// A block's output is multiplied by this before it joins the residual (Granite).
    pub residual_scale: Option<f32>,
    /// Attention scores are multiplied by this instead of 1/√head_dim (Granite).
    pub attn_scale: Option<f32>,
    /// Logits are divided by this (Granite: multiplied by its inverse, as llama.cpp).
    pub logit_scale: Option<f32>,
}

/// Upper bounds that keep a hostile file from asking for absurd allocations.
const MAX_LAYERS: u32 = 1024;
const MAX_DIM: u32 = 1 << 20;

/// The context a command gets when none is asked for: the trained one, at most this.
pub const DEFAULT_MAX_CTX: usize = 4096;

impl ModelConfig {
    /// The context length for a requested `-c`, as llama.cpp reads it: none gives the
    /// trained context capped at [`DEFAULT_MAX_CTX`], 0 the trained context.
    pub fn context_for(&self, requested: Option<usize>) -> usize {
        match requested {
            None => self.n_ctx_train.min(DEFAULT_MAX_CTX),
            Some(0) => self.n_ctx_train,
            Some(c) => c,
        }
    }

    /// A warning for a context past the trained one, as llama.cpp gives.
    pub fn context_warning(&self, ctx: usize) -> Option<String> {
        (ctx > self.n_ctx_train).then(|| format!("a context of {ctx} tokens exceeds the {} this model was trained with: text past that may degrade", self.n_ctx_train))
    }

    /// Read and validate the hyper-parameters of `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        let arch = Arch::from_name(file.get_str("general.architecture")?)?;
        let key = |suffix: &str| format!("{}.{suffix}", arch.name());
        let bounded = |suffix: &str, max: u32| -> Result<usize, ModelError> {
            let k = key(suffix);
            let v = file.get_u32(&k)?;
            if v == 0 || v > max {
                return Err(ModelError::BadConfig(format!("{k} = {v} is out of range 1..={max}")));
            }
            Ok(v as usize)
        };
        let optional = |suffix: &str| -> Result<Option<usize>, ModelError> {
            match file.opt_u32(&key(suffix))? {
                Some(0) => Err(ModelError::BadConfig(format!("{} must not be 0", key(suffix)))),
                Some(v) if v > MAX_DIM => {
                    Err(ModelError::BadConfig(format!("{} = {v} is too large", key(suffix))))
                }
                v => Ok(v.map(|v| v as usize)),
            }
        };

        let n_layers = bounded("block_count", MAX_LAYERS)?;
        let n_embd = bounded("embedding_length", MAX_DIM)?;
        // These three may be per-layer arrays, as llama.cpp reads them; one value for
        // every layer is all this engine runs.
        let uniform = |suffix: &str| -> Result<Option<usize>, ModelError> {
            let k = key(suffix);
            let Some(Value::Array(per_layer)) = file.get(&k) else {
                return optional(suffix);
            };
            let values = per_layer.to_u64s().ok_or_else(|| {
                ModelError::BadConfig(format!("{k} is an {}, not integers", per_layer.type_name()))
            })?;
            if values.len() != n_layers {
                return Err(ModelError::BadConfig(format!(
                    "{k} has {} per-layer values for {n_layers} layers",
                    values.len()
                )));
            }
            let value = values[0];
            if values.iter().any(|&v| v != value) {
                return Err(ModelError::Unsupported(format!("layers of different shapes ({k} varies by layer)")));
            }
            match u32::try_from(value) {
                Ok(0) => Err(ModelError::BadConfig(format!("{k} must not be 0"))),
                Ok(v) if v <= MAX_DIM => Ok(Some(v as usize)),
                _ => Err(ModelError::BadConfig(format!("{k} = {value} is too large"))),
            }
        };
        let required = |suffix: &str| uniform(suffix)?.ok_or_else(|| ModelError::from(GgufError::MissingKey(key(suffix))));
        let moe = Self::moe_from_gguf(file, arch)?;
        // An expert's width, for a mixture of experts (Mixtral's files give it as the FFN's).
        let n_ff = match (moe, optional("expert_feed_forward_length")?) {
            (Some(_), Some(n)) => n,
            (None, _) if arch == Arch::Qwen3Moe => return Err(ModelError::BadConfig(format!("{} has no experts", key("expert_count")))),
            _ => required("feed_forward_length")?,
        };
        let n_head = required("attention.head_count")?;
        let n_head_kv = uniform("attention.head_count_kv")?.unwrap_or(n_head);
        let head_dim = optional("attention.key_length")?.unwrap_or(n_embd / n_head);
        if let Some(v_dim) = optional("attention.value_length")? {
            if v_dim != head_dim {
                return Err(ModelError::Unsupported(format!(
                    "value head size {v_dim} different from key head size {head_dim}"
                )));
            }
        }
        if n_head % n_head_kv != 0 {
            return Err(ModelError::BadConfig(format!(
                "head_count {n_head} is not a multiple of head_count_kv {n_head_kv}"
            )));
        }
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(ModelError::BadConfig(format!("head size {head_dim} must be even and non-zero")));
        }
        let n_ctx_train = optional("context_length")?.unwrap_or(2048);
        let norm_eps = file.opt_f32(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5);
        if !(norm_eps.is_finite() && norm_eps >= 0.0) {
            return Err(ModelError::BadConfig(format!("rms epsilon {norm_eps} is not a valid number")));
        }

        let rope = Self::rope_from_gguf(file, arch, head_dim, n_ctx_train)?;
        let vocab_size = match optional("vocab_size")? {
            Some(v) => v,
            None => file.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let name = file.opt_str("general.name")?.unwrap_or(arch.name()).to_string();
        let gemma = matches!(arch, Arch::Gemma2 | Arch::Gemma3);
        let sliding = Self::sliding_from_gguf(file, arch, n_layers, &rope)?;
        // Soft-capping as llama.cpp reads it: Gemma 2 caps scores (50) and logits (30)
        // unless the file says otherwise, Gemma 3 caps logits when the file asks; 0: none.
        let cap = |suffix: &str, default: Option<f32>| -> Result<Option<f32>, ModelError> {
            match file.opt_f32(&key(suffix))?.or(default).filter(|&c| c != 0.0) {
                Some(c) if !(c.is_finite() && c > 0.0) => Err(ModelError::BadConfig(format!("{} = {c} is not valid", key(suffix)))),
                c => Ok(c),
            }
        };
        let (logit_softcap, attn_softcap) = match arch {
            Arch::Gemma2 => (cap("final_logit_softcapping", Some(30.0))?, cap("attn_logit_softcapping", Some(50.0))?),
            Arch::Gemma3 => (cap("final_logit_softcapping", None)?, None),
            _ => (None, None),
        };
        let granite = arch == Arch::Granite;
        // Granite's multipliers, as llama.cpp reads them (0 or absent: none).
        let multiplier = |suffix: &str| -> Result<Option<f32>, ModelError> {
            match file.opt_f32(&key(suffix))?.filter(|&v| granite && v != 0.0) {
                Some(v) if !v.is_finite() => Err(ModelError::BadConfig(format!("{} = {v} is not a number", key(suffix)))),
                v => Ok(v),
            }
        };
        if granite && file.get(&key("rope.scaling.finetuned")).is_some_and(|v| matches!(v, Value::Bool(false))) {
            return Err(ModelError::Unsupported("a Granite model without rope (rope.scaling.finetuned = false)".into()));
        }
        let (embd_multiplier, residual_scale, attn_scale, logit_scale) = (multiplier("embedding_scale")?, multiplier("residual_scale")?, multiplier("attention.scale")?, multiplier("logit_scale")?);
        // Gemma 2 27B and Gemma 3 27B, whose heads are not d / heads wide, scale queries by
        // 1/√(d / heads), as llama.cpp does.
        let wide_heads = matches!((arch, n_layers), (Arch::Gemma2, 46) | (Arch::Gemma3, 62));

        Ok(ModelConfig {
            arch,
            name,
            n_layers,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_ctx_train,
            norm_eps,
            rope,
            vocab_size,
            pre_norms: arch != Arch::Olmo2,
            qk_norm: match arch {
                Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3 => Some(QkNorm::PerHead),
                Arch::Olmo2 => Some(QkNorm::Whole),
                _ => None,
            },
            no_rope_every: (arch == Arch::Smollm3).then_some(4),
            moe,
            attn_softcap,
            // As llama.cpp: √d in f32.
            embd_scale: if gemma { Some((n_embd as f32).sqrt()) } else { embd_multiplier },
            post_norms: gemma || arch == Arch::Olmo2,
            ffn_act: if gemma { FfnAct::GeluTanh } else { FfnAct::Silu },
            // Queries scaled after rope, scores not (Gemma, Phi-3): 1/√head_dim.
            query_scale: match arch {
                _ if gemma => Some(1.0 / (if wide_heads { n_embd / n_head } else { head_dim } as f32).sqrt()),
                Arch::Phi3 => Some(1.0 / (head_dim as f32).sqrt()),
                _ => None,
            },
            sliding,
            logit_softcap,
            residual_scale,
            attn_scale,
            logit_scale,
        })
    }

    /// The experts a file declares, as llama.cpp reads them for the families that have
    /// them (Llama files with experts are Mixtral's); other families' are refused.
    fn moe_from_gguf(file: &GgufFile, arch: Arch) -> Result<Option<Moe>, ModelError> {
        let key = |suffix: &str| format!("{}.{suffix}", arch.name());
        let Some(n_expert) = file.opt_u32(&key("expert_count"))?.filter(|&n| n > 0).map(|n| n as usize) else {
            return Ok(None);
        };
        if !matches!(arch, Arch::Llama | Arch::Qwen3Moe) {
            return Err(ModelError::Unsupported(format!("mixture-of-experts {} models ({n_expert} experts)", arch.name())));
        }
        if n_expert > 512 {
            return Err(ModelError::BadConfig(format!("{} = {n_expert} is too large", key("expert_count"))));
        }
        let n_used = file.opt_u32(&key("expert_used_count"))?.map_or(0, |n| n as usize);
        if n_used == 0 || n_used > n_expert {
            return Err(ModelError::BadConfig(format!("{} = {n_used} must be between 1 and the {n_expert} experts", key("expert_used_count"))));
        }
        if file.opt_u32(&key("expert_shared_count"))?.is_some_and(|n| n > 0) {
            return Err(ModelError::Unsupported("shared experts".into()));
        }
        let weights_scale = match file.opt_f32(&key("expert_weights_scale"))? {
            Some(s) if !s.is_finite() => return Err(ModelError::BadConfig(format!("{} = {s} is not a number", key("expert_weights_scale")))),
            Some(s) if s != 0.0 && s != 1.0 => Some(s),
            _ => None,
        };
        Ok(Some(Moe { n_expert, n_used, norm_weights: true, weights_scale }))
    }

    /// The local layers as llama.cpp reads each family: Gemma 3 (window from the file,
    /// every sixth layer global, local rope base 10,000 unscaled), Gemma 2 (window 4096 by
    /// default, every other layer global, the global rope), OLMo 3 files of `olmo2` (a
    /// window in the file, every fourth layer global, unscaled rope).
    fn sliding_from_gguf(file: &GgufFile, arch: Arch, n_layers: usize, rope: &RopeConfig) -> Result<Option<SlidingWindow>, ModelError> {
        let key = |suffix: &str| format!("{}.{suffix}", arch.name());
        let base = |default: f32| -> Result<f32, ModelError> {
            let base = file.opt_f32(&key("rope.freq_base_swa"))?.unwrap_or(default);
            if !(base.is_finite() && base > 1.0) {
                return Err(ModelError::BadConfig(format!("{} = {base} is not valid", key("rope.freq_base_swa"))));
            }
            Ok(base)
        };
        let window = file.opt_u32(&key("attention.sliding_window"))?;
        let (window, period, local_rope) = match arch {
            Arch::Gemma3 => (window, 6, RopeConfig { freq_base: base(10_000.0)?, scaling: RopeScaling::None, ..*rope }),
            Arch::Gemma2 => (Some(window.unwrap_or(4096)), 2, RopeConfig { freq_base: base(rope.freq_base)?, ..*rope }),
            Arch::Olmo2 => (window, 4, RopeConfig { freq_base: base(rope.freq_base)?, scaling: RopeScaling::None, attn_factor: 1.0, ..*rope }),
            _ => return Ok(None),
        };
        match window {
            None | Some(0) if arch != Arch::Gemma2 => Ok(None),
            None | Some(0) => Err(ModelError::BadConfig(format!("{} must not be 0", key("attention.sliding_window")))),
            Some(window) => Ok(Some(SlidingWindow {
                window: window as usize,
                layers: Self::local_layers(file, &key("attention.sliding_window_pattern"), n_layers, period)?,
                rope: local_rope,
            })),
        }
    }

    /// Which layers are local, as llama.cpp reads the pattern: a per-layer array, or a
    /// period n whose last layer is global (the family's default).
    fn local_layers(file: &GgufFile, key: &str, n_layers: usize, default_period: u32) -> Result<Vec<bool>, ModelError> {
        if let Some(Value::Array(per_layer)) = file.get(key) {
            let values = match per_layer {
                blink_gguf::Array::Bool(flags) => flags.iter().map(|&f| u64::from(f)).collect(),
                other => other.to_u64s().ok_or_else(|| ModelError::BadConfig(format!("{key} is an {}, not flags", other.type_name())))?,
            };
            if values.len() != n_layers {
                return Err(ModelError::BadConfig(format!("{key} has {} values for {n_layers} layers", values.len())));
            }
            return Ok(values.iter().map(|&v| v != 0).collect());
        }
        let period = file.opt_u32(key)?.unwrap_or(default_period) as usize;
        Ok((0..n_layers).map(|l| period == 0 || l % period < period - 1).collect())
    }

    /// Whether a block's output is kept apart (in `xn`) before it joins the residual, to be
    /// normed or scaled first.
    pub fn block_out_apart(&self) -> bool {
        self.post_norms || self.residual_scale.is_some()
    }

    /// Whether layer `layer` rotates its queries and keys.
    pub fn ropes(&self, layer: usize) -> bool {
        self.no_rope_every.is_none_or(|n| !(layer + 1).is_multiple_of(n))
    }

    /// Whether layer `layer` attends within a sliding window.
    pub fn is_local(&self, layer: usize) -> bool {
        self.sliding.as_ref().is_some_and(|s| s.layers[layer])
    }

    /// Floats of rope angles a row holds: the global layers', then the local ones' if any.
    pub fn rope_width(&self) -> usize {
        self.rope.n_dims * if self.sliding.is_some() { 2 } else { 1 }
    }

    fn rope_from_gguf(
        file: &GgufFile,
        arch: Arch,
        head_dim: usize,
        n_ctx_train: usize,
    ) -> Result<RopeConfig, ModelError> {
        let key = |suffix: &str| format!("{}.{suffix}", arch.name());
        let order = match arch {
            Arch::Llama | Arch::Granite | Arch::Smollm3 => RopeOrder::Normal,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma2 | Arch::Gemma3 | Arch::Olmo2 | Arch::Phi3 => RopeOrder::NeoX,
        };
        let n_dims = file.opt_u32(&key("rope.dimension_count"))?.map_or(head_dim, |v| v as usize);
        if n_dims == 0 || n_dims > head_dim || n_dims % 2 != 0 {
            return Err(ModelError::BadConfig(format!(
                "rope dimension count {n_dims} must be even and at most the head size {head_dim}"
            )));
        }
        let freq_base = file.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        if !(freq_base.is_finite() && freq_base > 1.0) {
            return Err(ModelError::BadConfig(format!("rope freq_base {freq_base} is not valid")));
        }
        // As llama.cpp: the type defaults to linear, the factor to the old `rope.scale_linear`
        // key, and a factor of 0 (or none) means no scaling.
        let scaling_type = file.opt_str(&key("rope.scaling.type"))?.unwrap_or("linear");
        let factor = match file.opt_f32(&key("rope.scaling.factor"))? {
            Some(f) => Some(f),
            None => file.opt_f32(&key("rope.scale_linear"))?,
        };
        let factor = match factor {
            Some(0.0) => 1.0,
            Some(f) if f.is_finite() && f > 0.0 => f,
            Some(f) => return Err(ModelError::BadConfig(format!("rope scaling factor {f} is not valid"))),
            None => 1.0,
        };
        let original_ctx = match file.opt_u32(&key("rope.scaling.original_context_length"))? {
            Some(0) | None => n_ctx_train,
            Some(c) => c as usize,
        };
        let scaling = match scaling_type {
            "none" => RopeScaling::None,
            _ if factor == 1.0 => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor },
            "yarn" => {
                RopeScaling::Yarn {
                    factor,
                    original_ctx: original_ctx as u32,
                    ext_factor: 1.0,
                    beta_fast: file.opt_f32(&key("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0),
                    beta_slow: file.opt_f32(&key("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0),
                }
            }
            other => {
                return Err(ModelError::Unsupported(format!("rope scaling type '{other}'")));
            }
        };
        let attn_factor = file.opt_f32(&key("rope.scaling.attn_factor"))?.unwrap_or(1.0);
        if !(attn_factor.is_finite() && attn_factor > 0.0) {
            return Err(ModelError::BadConfig(format!("rope attention factor {attn_factor} is not valid")));
        }
        Ok(RopeConfig { order, n_dims, freq_base, scaling, attn_factor, original_ctx })
    }

    /// Width of the key (and value) projection: `n_head_kv * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of the query projection: `n_head * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
}
