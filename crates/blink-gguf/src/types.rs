//! The ggml tensor element types a GGUF file can declare, with their block geometry.
//!
//! Numbering follows the GGUF specification (`ggml_type`). Only the types Blink can compute
//! with are listed; a file naming any other id is rejected when it is opened.

use std::fmt;

/// Element type of a tensor stored in a GGUF file.
///
/// Quantized types store `block_size()` elements in `type_size()` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// Elements per super-block of the k-quants.
pub const QK_K: usize = 256;

impl GgmlType {
    /// Every supported type, in id order.
    pub const ALL: [GgmlType; 25] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
    ];

    /// The type for a GGUF type id, or `None` if Blink does not support it.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::IQ2_XXS => 16,
            GgmlType::IQ2_XS => 17,
            GgmlType::IQ3_XXS => 18,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ3_S => 21,
            GgmlType::IQ2_S => 22,
            GgmlType::IQ4_XS => 23,
            GgmlType::BF16 => 30,
            GgmlType::TQ1_0 => 34,
            GgmlType::TQ2_0 => 35,
            GgmlType::MXFP4 => 39,
        }
    }

    /// Elements per block (1 for the float types).
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => 32,
            GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::IQ4_NL | GgmlType::MXFP4 => 32,
            GgmlType::IQ4_XS | GgmlType::TQ1_0 | GgmlType::TQ2_0 => QK_K,
            GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S | GgmlType::IQ3_XXS | GgmlType::IQ3_S => QK_K,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K => QK_K,
            GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q8_K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q8_1 => 36,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::Q8_K => 292,
            GgmlType::IQ2_XXS => 66,
            GgmlType::IQ2_XS => 74,
            GgmlType::IQ2_S => 82,
            GgmlType::IQ3_XXS => 98,
            GgmlType::IQ3_S => 110,
            GgmlType::IQ4_NL => 18,
            GgmlType::IQ4_XS => 136,
            GgmlType::TQ1_0 => 54,
            GgmlType::TQ2_0 => 66,
            GgmlType::MXFP4 => 17,
        }
    }

    /// Bytes taken by a row of `n` elements, or `None` if `n` is not a whole number of
    /// blocks or the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }

    /// True for the block-quantized types.
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// The name llama.cpp uses for this type (`"Q4_1"`, `"F16"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::Q8_K => "Q8_K",
            GgmlType::IQ2_XXS => "IQ2_XXS",
            GgmlType::IQ2_XS => "IQ2_XS",
            GgmlType::IQ2_S => "IQ2_S",
            GgmlType::IQ3_XXS => "IQ3_XXS",
            GgmlType::IQ3_S => "IQ3_S",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::IQ4_XS => "IQ4_XS",
            GgmlType::BF16 => "BF16",
            GgmlType::TQ1_0 => "TQ1_0",
            GgmlType::TQ2_0 => "TQ2_0",
            GgmlType::MXFP4 => "MXFP4",
        }
    }
}

/// An unsupported type id as a message names it: ggml's name for the ids it has given one
/// (`IQ1_S (id 19)`), else the bare id.
pub fn describe_unsupported(id: u32) -> String {
    let name = match id {
        4 => "Q4_2 (removed from ggml)",
        5 => "Q4_3 (removed from ggml)",
        19 => "IQ1_S",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        31..=33 => "Q4_0 interleaved (removed from GGUF files)",
        36..=38 => "IQ4_NL interleaved (removed from GGUF files)",
        40 => "NVFP4",
        41 => "Q1_0",
        42 => "Q2_0",
        _ => return format!("id {id}"),
    };
    format!("{name} (id {id})")
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(u32::MAX), None);
    }

    #[test]
    fn row_bytes_requires_whole_blocks() {
        assert_eq!(GgmlType::Q4_1.row_bytes(64), Some(40));
        assert_eq!(GgmlType::Q4_1.row_bytes(33), None);
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
        assert_eq!(GgmlType::Q8_0.row_bytes(u64::MAX - 31), None);
    }
}
