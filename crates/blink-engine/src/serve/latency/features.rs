//! What the latency model sees of a step: the training unit type (`UnitKind`, `UnitCost`,
//! the contract with the trainer), the feature vectors of an inference pass and of a
//! training unit, the kinds of step errors are tracked by, and the nominal feature scales
//! the online fit works in.

use serde::{Deserialize, Serialize};

use crate::serve::StepCost;

/// Features of an inference pass: [1, prompt tokens, Σ chunk², decode rows, context tokens,
/// adapters].
pub const PASS_FEATURES: usize = 6;
/// Features of a training unit: [1, rows·layers (forward), attn·layers (forward),
/// rows·layers (backward), attn·layers (backward), head rows, parameters updated
/// (optimizer), parameters whose squares are summed (gradient norm)].
pub const UNIT_FEATURES: usize = 8;

/// What a training unit does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnitKind {
    /// The forward pass over `layers` layers, saving activations.
    Forward,
    /// The loss head over the vocabulary, for the rows with a target.
    Head,
    /// The backward pass over `layers` layers.
    Backward,
    /// The gradients' global norm over some layers' adapter parameters (for clipping),
    /// the optimizer's first part.
    GradNorm,
    /// The optimizer's update of some layers' adapter parameters.
    Optimizer,
}

/// The size of one training unit, in the terms the latency model is fitted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitCost {
    pub kind: UnitKind,
    /// Training tokens (rows) in the batch the unit works on.
    pub rows: usize,
    /// Σ len² over the batch's examples (attention within each example).
    pub attn: usize,
    /// Layers the unit covers (Forward, Backward, GradNorm, Optimizer); 0 for a Head.
    pub layers: usize,
    /// Rows with a target (Head: the loss head over the vocabulary).
    pub head_rows: usize,
    /// Adapter parameters the unit covers (GradNorm, Optimizer).
    pub params: usize,
}

/// The kinds of step whose errors are tracked apart (each has its own margin).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// A pass of decode rows only.
    Decode,
    /// A pass of prompt rows only.
    Prefill,
    /// A pass with both.
    Mixed,
    TrainForward,
    TrainHead,
    TrainBackward,
    Optimizer,
}

impl StepKind {
    pub const ALL: [StepKind; 7] = [
        StepKind::Decode,
        StepKind::Prefill,
        StepKind::Mixed,
        StepKind::TrainForward,
        StepKind::TrainHead,
        StepKind::TrainBackward,
        StepKind::Optimizer,
    ];

    /// Its name, as in the coefficient file and in metrics.
    pub fn name(self) -> &'static str {
        match self {
            StepKind::Decode => "decode",
            StepKind::Prefill => "prefill",
            StepKind::Mixed => "mixed",
            StepKind::TrainForward => "train_forward",
            StepKind::TrainHead => "train_head",
            StepKind::TrainBackward => "train_backward",
            StepKind::Optimizer => "optimizer",
        }
    }

    /// Its place in [`StepKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The kind of an inference pass; `None` for a pass without rows.
    pub fn of_pass(cost: &StepCost) -> Option<StepKind> {
        match (cost.prompt_tokens > 0, cost.decode_rows > 0) {
            (false, false) => None,
            (false, true) => Some(StepKind::Decode),
            (true, false) => Some(StepKind::Prefill),
            (true, true) => Some(StepKind::Mixed),
        }
    }

    pub fn of_unit(cost: &UnitCost) -> StepKind {
        match cost.kind {
            UnitKind::Forward => StepKind::TrainForward,
            UnitKind::Head => StepKind::TrainHead,
            UnitKind::Backward => StepKind::TrainBackward,
            UnitKind::GradNorm | UnitKind::Optimizer => StepKind::Optimizer,
        }
    }
}

/// A pass's features, in natural units.
pub fn pass_features(c: &StepCost) -> [f64; PASS_FEATURES] {
    [1.0, c.prompt_tokens as f64, c.chunk_tokens_squared as f64, c.decode_rows as f64, c.context_tokens as f64, c.adapters as f64]
}

/// A unit's features, in natural units (zeros where the kind differs).
pub fn unit_features(u: &UnitCost) -> [f64; UNIT_FEATURES] {
    let layered = |v: usize| v as f64 * u.layers as f64;
    let mut x = [0.0; UNIT_FEATURES];
    x[0] = 1.0;
    match u.kind {
        UnitKind::Forward => {
            x[1] = layered(u.rows);
            x[2] = layered(u.attn);
        }
        UnitKind::Backward => {
            x[3] = layered(u.rows);
            x[4] = layered(u.attn);
        }
        UnitKind::Head => x[5] = u.head_rows as f64,
        UnitKind::Optimizer => x[6] = u.params as f64,
        UnitKind::GradNorm => x[7] = u.params as f64,
    }
    x
}

/// Typical values of the pass's features (a 512-token chunk, 32 decode rows over 1k
/// positions each, a few adapters). The online fit divides features by them so that its
/// coefficients are seconds at a typical size, all of a similar magnitude; this is for
/// conditioning only, and values within a few orders of magnitude of real ones serve.
pub(super) const PASS_SCALE: [f64; PASS_FEATURES] = [1.0, 512.0, 262_144.0, 32.0, 32_768.0, 4.0];

/// Typical values of a unit's features (a 512-row batch of one 512-token example over 32
/// layers, a rank-8 adapter on every projection of a small model).
pub(super) const UNIT_SCALE: [f64; UNIT_FEATURES] = [1.0, 16_384.0, 8_388_608.0, 16_384.0, 8_388_608.0, 512.0, 1_048_576.0, 1_048_576.0];
