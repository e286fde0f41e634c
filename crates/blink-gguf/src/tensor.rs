//! Tensor descriptors and the shape rules shared by the reader and the writer.

use std::fmt;

use crate::types::GgmlType;
use crate::{MAX_DIMS, MAX_ELEMENTS};

/// One entry of a GGUF file's tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// Shape in ggml order: `dims[0]` is the row length (the fastest-varying dimension).
    pub dims: Vec<u64>,
    /// Byte offset of the data, relative to the start of the data section.
    pub offset: u64,
    /// Exact size of the data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Total number of elements (the product of `dims`).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Elements per row: `dims[0]`.
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of `dims[1..]`.
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }
}

impl fmt::Display for TensorInfo {
    /// `blk.0.attn_q.weight Q4_1 [576, 576]`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {:?}", self.name, self.ty, self.dims)
    }
}

/// Validates a tensor shape for type `ty` and returns its size in bytes, or a description
/// of what is wrong (to be wrapped with the tensor's name).
pub(crate) fn tensor_n_bytes(ty: GgmlType, dims: &[u64]) -> Result<u64, String> {
    if dims.is_empty() || dims.len() > MAX_DIMS {
        return Err(format!(
            "has {} dimensions, must have 1 to {MAX_DIMS}",
            dims.len()
        ));
    }
    let mut n_elements = 1u64;
    for (i, &d) in dims.iter().enumerate() {
        if d == 0 {
            return Err(format!("dims[{i}] is 0; empty tensors are not supported"));
        }
        if d > MAX_ELEMENTS {
            return Err(format!("dims[{i}]={d} exceeds the limit of 2^50 elements"));
        }
        n_elements = n_elements
            .checked_mul(d)
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| format!("shape {dims:?} has more than 2^50 elements"))?;
    }
    let row_bytes = ty.row_bytes(dims[0]).ok_or_else(|| {
        format!(
            "dims[0]={} is not a multiple of the {ty} block size {}",
            dims[0],
            ty.block_size()
        )
    })?;
    let n_rows = n_elements / dims[0];
    row_bytes
        .checked_mul(n_rows)
        .ok_or_else(|| format!("byte size of shape {dims:?} overflows"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_shape_errors() {
        assert_eq!(tensor_n_bytes(GgmlType::Q4_1, &[64, 3]), Ok(120));
        assert_eq!(tensor_n_bytes(GgmlType::F32, &[5]), Ok(20));
        assert!(tensor_n_bytes(GgmlType::F32, &[])
            .unwrap_err()
            .contains("0 dimensions"));
        assert!(tensor_n_bytes(GgmlType::F32, &[1; 5])
            .unwrap_err()
            .contains("5 dimensions"));
        assert!(tensor_n_bytes(GgmlType::F32, &[4, 0])
            .unwrap_err()
            .contains("dims[1] is 0"));
        assert!(tensor_n_bytes(GgmlType::F32, &[u64::MAX])
            .unwrap_err()
            .contains("dims[0]"));
        let big = 1u64 << 30;
        assert!(tensor_n_bytes(GgmlType::F32, &[big, big])
            .unwrap_err()
            .contains("2^50"));
        let err = tensor_n_bytes(GgmlType::Q4_1, &[33, 2]).unwrap_err();
        assert_eq!(
            err,
            "dims[0]=33 is not a multiple of the Q4_1 block size 32"
        );
    }

    #[test]
    fn row_helpers() {
        let t = TensorInfo {
            name: "w".into(),
            ty: GgmlType::F32,
            dims: vec![4, 3, 2],
            offset: 0,
            n_bytes: 96,
        };
        assert_eq!((t.n_elements(), t.row_len(), t.n_rows()), (24, 4, 6));
        assert_eq!(t.to_string(), "w F32 [4, 3, 2]");
    }
}
