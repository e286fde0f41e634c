//! The model's coefficients, in natural units (seconds per unit of each feature), with
//! what they were measured on and how well the calibration fitted: the value the offline
//! fit produces, the coefficient file holds and the online model starts from.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::features::{StepKind, PASS_FEATURES, UNIT_FEATURES};

/// Seconds an inference pass takes: `base` plus each feature times its coefficient.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PassCoefficients {
    /// Seconds per pass, whatever it holds.
    pub base: f64,
    /// Seconds per prompt token.
    pub prompt_token: f64,
    /// Seconds per unit of Σ chunk².
    pub chunk_token_squared: f64,
    /// Seconds per decode row.
    pub decode_row: f64,
    /// Seconds per cached position read by attention.
    pub context_token: f64,
    /// Seconds per distinct adapter mix in the pass.
    pub adapter: f64,
}

/// Seconds a training unit takes: `base` plus each feature times its coefficient.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnitCoefficients {
    /// Seconds per unit, whatever its kind.
    pub base: f64,
    /// Seconds per row and layer of a forward unit.
    pub forward_row_layer: f64,
    /// Seconds per unit of Σ len² and layer of a forward unit.
    pub forward_attn_layer: f64,
    /// Seconds per row and layer of a backward unit.
    pub backward_row_layer: f64,
    /// Seconds per unit of Σ len² and layer of a backward unit.
    pub backward_attn_layer: f64,
    /// Seconds per row with a target in the head unit.
    pub head_row: f64,
    /// Seconds per adapter parameter in an optimizer update unit.
    pub optimizer_param: f64,
    /// Seconds per adapter parameter in a gradient-norm unit.
    pub norm_param: f64,
}

impl PassCoefficients {
    pub fn to_array(&self) -> [f64; PASS_FEATURES] {
        [self.base, self.prompt_token, self.chunk_token_squared, self.decode_row, self.context_token, self.adapter]
    }

    pub fn from_array(a: [f64; PASS_FEATURES]) -> PassCoefficients {
        let [base, prompt_token, chunk_token_squared, decode_row, context_token, adapter] = a;
        PassCoefficients { base, prompt_token, chunk_token_squared, decode_row, context_token, adapter }
    }

    /// Conservative stand-ins for a machine never measured: a quarter second per pass
    /// and more per row than any CPU this engine targets needs for a small model, so that
    /// no training work is admitted on a guess. The online fit brings them down with data.
    pub fn uncalibrated() -> PassCoefficients {
        PassCoefficients {
            base: 0.25,
            prompt_token: 2e-3,
            chunk_token_squared: 2e-8,
            decode_row: 2e-2,
            context_token: 1e-6,
            adapter: 2e-2,
        }
    }
}

impl UnitCoefficients {
    pub fn to_array(&self) -> [f64; UNIT_FEATURES] {
        [
            self.base,
            self.forward_row_layer,
            self.forward_attn_layer,
            self.backward_row_layer,
            self.backward_attn_layer,
            self.head_row,
            self.optimizer_param,
            self.norm_param,
        ]
    }

    pub fn from_array(a: [f64; UNIT_FEATURES]) -> UnitCoefficients {
        let [base, forward_row_layer, forward_attn_layer, backward_row_layer, backward_attn_layer, head_row, optimizer_param, norm_param] = a;
        UnitCoefficients { base, forward_row_layer, forward_attn_layer, backward_row_layer, backward_attn_layer, head_row, optimizer_param, norm_param }
    }

    /// Conservative stand-ins, as [`PassCoefficients::uncalibrated`].
    pub fn uncalibrated() -> UnitCoefficients {
        UnitCoefficients {
            base: 0.25,
            forward_row_layer: 5e-5,
            forward_attn_layer: 5e-8,
            backward_row_layer: 1e-4,
            backward_attn_layer: 1e-7,
            head_row: 1e-3,
            optimizer_param: 1e-7,
            norm_param: 2e-8,
        }
    }
}

/// How well a calibration fitted its own samples, for one kind of step. Errors are
/// relative, `(actual − predicted) / predicted`, and taken in absolute value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KindFit {
    pub kind: StepKind,
    pub count: usize,
    pub median_abs_error: f64,
    pub p95_abs_error: f64,
    pub max_abs_error: f64,
}

/// What the offline fit was given and how well it did. A part fitted on no samples keeps
/// the uncalibrated coefficients, and the online model trusts it as little as those.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FitReport {
    /// Samples of inference passes fitted (after dropping unusable ones).
    pub pass_samples: usize,
    /// Samples of training units fitted.
    pub unit_samples: usize,
    /// Features no sample of their part exercised (their coefficient is 0 if the part was
    /// fitted): the calibration's sweep did not measure them.
    pub unexercised: Vec<String>,
    /// Per kind of step with samples.
    pub kinds: Vec<KindFit>,
}

/// Both parts' coefficients, with the setup they were measured on (a free-form object:
/// model file name and size, threads, kernel path, dot order; the caller fills it) and the
/// calibration's report.
#[derive(Clone, Debug, PartialEq)]
pub struct Coefficients {
    pub pass: PassCoefficients,
    pub unit: UnitCoefficients,
    pub setup: Map<String, Value>,
    pub fit: FitReport,
}

impl Coefficients {
    /// The conservative stand-ins of a machine never measured (no samples in the report).
    pub fn uncalibrated() -> Coefficients {
        Coefficients {
            pass: PassCoefficients::uncalibrated(),
            unit: UnitCoefficients::uncalibrated(),
            setup: Map::new(),
            fit: FitReport::default(),
        }
    }

    /// The first coefficient that is not a finite number ≥ 0, by its name in the file.
    pub(super) fn first_invalid(&self) -> Option<(&'static str, f64)> {
        let pass = PASS_NAMES.iter().zip(self.pass.to_array());
        let unit = UNIT_NAMES.iter().zip(self.unit.to_array());
        pass.chain(unit).find(|&(_, v)| !(v.is_finite() && v >= 0.0)).map(|(n, v)| (*n, v))
    }
}

/// The pass's coefficients' names, in feature order.
pub(super) const PASS_NAMES: [&str; PASS_FEATURES] =
    ["pass.base", "pass.prompt_token", "pass.chunk_token_squared", "pass.decode_row", "pass.context_token", "pass.adapter"];

/// The unit's coefficients' names, in feature order.
pub(super) const UNIT_NAMES: [&str; UNIT_FEATURES] = [
    "unit.base",
    "unit.forward_row_layer",
    "unit.forward_attn_layer",
    "unit.backward_row_layer",
    "unit.backward_attn_layer",
    "unit.head_row",
    "unit.optimizer_param",
    "unit.norm_param",
];
