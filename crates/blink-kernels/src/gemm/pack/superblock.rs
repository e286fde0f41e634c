//! The interleaved layout of the super-block formats (`Q4_K`, `Q5_K`, `Q6_K`, `IQ4_XS`).
//!
//! Each field of a 256-element block is a run of units: a scale's two bytes, a byte of
//! packed scales, four bytes of quants (one lane: four consecutive elements, or two lanes
//! of nibbles). A group-block of eight rows keeps the block's field order and gives each
//! field eight times its bytes, unit `i` of row `r` at `unit · (8i + r)` from the field's
//! start. So the eight rows' `d` are one vector of `f16`, byte `k` of the eight rows'
//! packed scales is eight consecutive bytes, and quant lane `i` of the eight rows is one
//! 32-byte vector, ready for a product against a broadcast activation lane:
//!
//! ```text
//! Q4_K    d[8] | dmin[8] | scales: byte k of row r at 8k + r (12 × 8) | qs: lane i of row r at 32i + 4r (32 lanes)
//! Q5_K    d[8] | dmin[8] | scales (12 × 8) | qh (8 lanes) | qs (32 lanes)
//! Q6_K    ql (32 lanes) | qh (16 lanes) | scales (16 × 8) | d[8]
//! IQ4_XS  d[8] | scales_h (2 × 8) | scales_l (4 × 8) | qs (32 lanes)
//! ```

use std::ops::Range;

use blink_gguf::GgmlType;

use super::GROUP;

/// A super-block format's fields in block order, each as (bytes, unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuperFields {
    pub block: usize,
    pub fields: &'static [(usize, usize)],
}

impl SuperFields {
    /// The fields of a super-block format with an interleaved layout, or `None`.
    pub const fn of(ty: GgmlType) -> Option<SuperFields> {
        let fields: &'static [(usize, usize)] = match ty {
            GgmlType::Q4_K => &[(2, 2), (2, 2), (12, 1), (128, 4)],
            GgmlType::Q5_K => &[(2, 2), (2, 2), (12, 1), (32, 4), (128, 4)],
            GgmlType::Q6_K => &[(128, 4), (64, 4), (16, 1), (2, 2)],
            GgmlType::IQ4_XS => &[(2, 2), (2, 1), (4, 1), (128, 4)],
            _ => return None,
        };
        let mut block = 0;
        let mut i = 0;
        while i < fields.len() {
            block += fields[i].0;
            i += 1;
        }
        Some(SuperFields { block, fields })
    }

    /// Bytes of one group-block.
    pub const fn group_block(&self) -> usize {
        GROUP * self.block
    }

    /// Each field's (offset in the block, bytes, unit); its packed offset is eight times
    /// the first.
    fn runs(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.fields.iter().scan(0, |at, &(len, unit)| {
            let start = *at;
            *at += len;
            Some((start, len, unit))
        })
    }

    /// Pack rows `rows` (at most [`GROUP`]) of the row-major `src`, `n_blocks` blocks a
    /// row, into the group `dst` (missing rows are zeros).
    pub(super) fn pack_group(&self, n_blocks: usize, src: &[u8], rows: Range<usize>, dst: &mut [u8]) {
        let row_bytes = n_blocks * self.block;
        assert!(rows.len() <= GROUP && src.len() >= rows.end * row_bytes, "pack: rows outside the source");
        assert_eq!(dst.len(), n_blocks * self.group_block(), "pack: a group of the wrong size");
        if rows.len() < GROUP {
            dst.fill(0);
        }
        for (b, gb) in dst.chunks_exact_mut(self.group_block()).enumerate() {
            for (r, row) in rows.clone().enumerate() {
                let blk = &src[row * row_bytes + b * self.block..][..self.block];
                for (at, len, unit) in self.runs() {
                    let (from, to) = (&blk[at..at + len], &mut gb[GROUP * at..GROUP * (at + len)]);
                    match unit {
                        4 => scatter::<4>(from, to, r),
                        2 => scatter::<2>(from, to, r),
                        _ => scatter::<1>(from, to, r),
                    }
                }
            }
        }
    }

}

/// Unit `i` of `from` (one row's field) to unit `8i + r` of `to` (the group's field): a
/// copy of a known size per unit (a slice copy of a run-time length would call `memmove`).
#[inline(always)]
fn scatter<const UNIT: usize>(from: &[u8], to: &mut [u8], r: usize) {
    for (i, unit) in from.chunks_exact(UNIT).enumerate() {
        let at = UNIT * (GROUP * i + r);
        to[at..at + UNIT].copy_from_slice(unit);
    }
}

impl SuperFields {
    /// Rebuild row `r`'s original block from a group-block.
    pub(super) fn unpack_block(&self, src: &[u8], r: usize, blk: &mut [u8]) {
        for (at, len, unit) in self.runs() {
            for i in 0..len / unit {
                let from = GROUP * at + unit * (GROUP * i + r);
                blk[at + unit * i..][..unit].copy_from_slice(&src[from..from + unit]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::pack::{pack, unpack_row};

    #[test]
    fn every_field_keeps_its_bytes_and_unpacking_restores_them() {
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS] {
            let f = SuperFields::of(ty).unwrap();
            assert_eq!(f.block, ty.type_size(), "{ty}");
            let (rows, cols) = (11, 512);
            let rb = cols / 256 * ty.type_size();
            let src: Vec<u8> = (0..rows * rb).map(|i| (i * 7 + i / 251) as u8).collect();
            let packed = pack(ty, rows, cols, &src).unwrap();
            assert_eq!(packed.len(), 16 * rb, "{ty}: two groups, the second padded");
            let mut row = vec![0u8; rb];
            for r in 0..16 {
                unpack_row(ty, cols, &packed, r, &mut row);
                let want = if r < rows { src[r * rb..(r + 1) * rb].to_vec() } else { vec![0; rb] };
                assert_eq!(row, want, "{ty} row {r}");
            }
        }
        // Q4_K's d of rows 0..8 are the group-block's first 16 bytes; its quant lane 1 of
        // row 2 is bytes 32·1 + 4·2 of the quants' place (8 · 16).
        let src: Vec<u8> = (0..8 * 144).map(|i| (i % 251) as u8).collect();
        let packed = pack(GgmlType::Q4_K, 8, 256, &src).unwrap();
        assert_eq!(&packed[2..4], &src[144..146]);
        assert_eq!(&packed[128 + 40..128 + 44], &src[2 * 144 + 16 + 4..2 * 144 + 16 + 8]);
    }
}
