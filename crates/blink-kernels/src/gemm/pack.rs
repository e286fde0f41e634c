//! Interleaved weight layout for the SIMD kernels of the 32-element formats.
//!
//! Rows are grouped by eight (the last group padded with zero rows). For each group and
//! block index, the eight rows' fields are stored together:
//! `d[8] | m[8] (Q4_1, Q5_1) | qh[8] (Q5_0, Q5_1) | qs[8]`. One group-block has exactly the
//! bytes of eight original blocks, so packing is a permutation; it lets a kernel load the
//! eight scales with one instruction and stream each row's quants contiguously.

use blink_gguf::GgmlType;

/// Rows per interleaved group.
pub const GROUP: usize = 8;

/// Where each field sits in one original block, and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub block: usize,
    /// Offset of the minimum `m` (f16), if any.
    pub m: Option<usize>,
    /// Offset of the 32-bit fifth-bit word, if any.
    pub qh: Option<usize>,
    pub qs: usize,
    pub qs_len: usize,
}

impl Fields {
    /// The fields of a packable type, or `None`.
    pub const fn of(ty: GgmlType) -> Option<Fields> {
        const fn f(block: usize, m: Option<usize>, qh: Option<usize>, qs: usize, qs_len: usize) -> Option<Fields> {
            Some(Fields { block, m, qh, qs, qs_len })
        }
        match ty {
            GgmlType::Q4_0 => f(18, None, None, 2, 16),
            GgmlType::Q4_1 => f(20, Some(2), None, 4, 16),
            GgmlType::Q5_0 => f(22, None, Some(2), 6, 16),
            GgmlType::Q5_1 => f(24, Some(2), Some(4), 8, 16),
            GgmlType::Q8_0 => f(34, None, None, 2, 32),
            _ => None,
        }
    }

    /// Offsets of the fields inside one packed group-block: (m, qh, qs).
    pub const fn packed_offsets(&self) -> (usize, usize, usize) {
        let m = 2 * GROUP;
        let qh = m + if self.m.is_some() { 2 * GROUP } else { 0 };
        let qs = qh + if self.qh.is_some() { 4 * GROUP } else { 0 };
        (m, qh, qs)
    }
}

/// Rows rounded up to whole groups.
pub fn padded_rows(rows: usize) -> usize {
    rows.div_ceil(GROUP) * GROUP
}

/// Repack a row-major matrix of `rows` × `cols` elements of `ty` into the interleaved
/// layout, or `None` if `ty` has no interleaved kernel.
pub fn pack(ty: GgmlType, rows: usize, cols: usize, src: &[u8]) -> Option<Vec<u8>> {
    let f = Fields::of(ty)?;
    let n_blocks = cols / 32;
    let row_bytes = n_blocks * f.block;
    assert!(cols % 32 == 0 && src.len() >= rows * row_bytes, "pack: source shorter than its rows");
    let (m_at, qh_at, qs_at) = f.packed_offsets();
    let group_block = GROUP * f.block;
    let mut out = vec![0u8; padded_rows(rows) / GROUP * n_blocks * group_block];
    for g in 0..padded_rows(rows) / GROUP {
        for b in 0..n_blocks {
            let dst = &mut out[(g * n_blocks + b) * group_block..][..group_block];
            for i in (0..GROUP).filter(|i| g * GROUP + i < rows) {
                let blk = &src[(g * GROUP + i) * row_bytes + b * f.block..][..f.block];
                dst[2 * i..2 * i + 2].copy_from_slice(&blk[..2]);
                if let Some(m) = f.m {
                    dst[m_at + 2 * i..m_at + 2 * i + 2].copy_from_slice(&blk[m..m + 2]);
                }
                if let Some(qh) = f.qh {
                    dst[qh_at + 4 * i..qh_at + 4 * i + 4].copy_from_slice(&blk[qh..qh + 4]);
                }
                dst[qs_at + f.qs_len * i..qs_at + f.qs_len * (i + 1)].copy_from_slice(&blk[f.qs..f.qs + f.qs_len]);
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_is_a_permutation_of_the_blocks() {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0] {
            let (rows, cols) = (13, 96);
            let src: Vec<u8> = (0..rows * cols / 32 * ty.type_size()).map(|i| (i * 7 + 3) as u8).collect();
            let packed = pack(ty, rows, cols, &src).unwrap();
            assert_eq!(packed.len(), 16 * cols / 32 * ty.type_size());
            let mut a: Vec<u8> = src.clone();
            let mut b: Vec<u8> = packed.iter().copied().filter(|&x| x != 0).collect();
            a.retain(|&x| x != 0);
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "{ty}");
        }
        assert!(pack(GgmlType::Q4_K, 8, 256, &[0; 8 * 144]).is_none());
    }
}
