//! The projections an adapter may change, with their names in each format and their
//! shapes in a model.

use crate::config::ModelConfig;

/// A projection of a transformer block that a LoRA pair can modify.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoraTarget {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl LoraTarget {
    /// Every target, in the order adapters store them.
    pub const ALL: [LoraTarget; 7] = [LoraTarget::Q, LoraTarget::K, LoraTarget::V, LoraTarget::O, LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down];

    /// Index into [`LoraTarget::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The module name PEFT and Hugging Face use (`q_proj`, …, `down_proj`).
    pub fn peft_name(self) -> &'static str {
        match self {
            LoraTarget::Q => "q_proj",
            LoraTarget::K => "k_proj",
            LoraTarget::V => "v_proj",
            LoraTarget::O => "o_proj",
            LoraTarget::Gate => "gate_proj",
            LoraTarget::Up => "up_proj",
            LoraTarget::Down => "down_proj",
        }
    }

    /// The submodule of a Hugging Face block that holds it (`self_attn` or `mlp`).
    pub fn peft_block(self) -> &'static str {
        match self {
            LoraTarget::Q | LoraTarget::K | LoraTarget::V | LoraTarget::O => "self_attn",
            LoraTarget::Gate | LoraTarget::Up | LoraTarget::Down => "mlp",
        }
    }

    /// The tensor name in a GGUF block (`attn_q`, …, `ffn_down`).
    pub fn gguf_name(self) -> &'static str {
        match self {
            LoraTarget::Q => "attn_q",
            LoraTarget::K => "attn_k",
            LoraTarget::V => "attn_v",
            LoraTarget::O => "attn_output",
            LoraTarget::Gate => "ffn_gate",
            LoraTarget::Up => "ffn_up",
            LoraTarget::Down => "ffn_down",
        }
    }

    /// The short name of `blink finetune --targets` (`q`, …, `down`).
    pub fn short_name(self) -> &'static str {
        match self {
            LoraTarget::Q => "q",
            LoraTarget::K => "k",
            LoraTarget::V => "v",
            LoraTarget::O => "o",
            LoraTarget::Gate => "gate",
            LoraTarget::Up => "up",
            LoraTarget::Down => "down",
        }
    }

    /// The target a PEFT module name (`q_proj`) or GGUF tensor name (`attn_q`) names.
    pub fn from_name(name: &str) -> Option<LoraTarget> {
        LoraTarget::ALL.into_iter().find(|t| name == t.peft_name() || name == t.gguf_name() || name == t.short_name())
    }

    /// `(out_features, in_features)` of this projection in `cfg`'s model.
    pub fn shape(self, cfg: &ModelConfig) -> (usize, usize) {
        match self {
            LoraTarget::Q => (cfg.q_dim(), cfg.n_embd),
            LoraTarget::K | LoraTarget::V => (cfg.kv_dim(), cfg.n_embd),
            LoraTarget::O => (cfg.n_embd, cfg.q_dim()),
            LoraTarget::Gate | LoraTarget::Up => (cfg.n_ff, cfg.n_embd),
            LoraTarget::Down => (cfg.n_embd, cfg.n_ff),
        }
    }
}
