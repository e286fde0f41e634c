//! The interleaved layout of the 32-element formats.
//!
//! Rows are grouped by eight (the last group padded with zero rows). A block's 32 quants
//! form eight "lanes" of four consecutive elements, the unit of an exact `dpbusd` sum. For
//! each group and block index the layout stores the eight rows' scales, minima and fifth
//! bits side by side, then the quants lane-major: lane `l` of all eight rows in 32 bytes,
//! so one `dpbusd` against a broadcast activation lane yields lane `l` of eight rows at
//! once. 4- and 5-bit formats share each 32-byte vector between lanes `l` (low nibbles)
//! and `l + 4` (high nibbles). One group-block holds exactly the bytes of eight original
//! blocks:
//!
//! ```text
//! d[8] f16 (MXFP4: e[8] u8) | m[8] f16 (Q4_1, Q5_1) | qh[lane 0..8] u32 (Q5_0, Q5_1) | quants
//! quants: 4-bit: for l in 0..4: 32 bytes, byte 4r+k = q[r][4l+k] | q[r][4(l+4)+k] << 4
//!         8-bit: for l in 0..8: 32 bytes, byte 4r+k = q[r][4l+k]
//! qh[l]: bit 4r+k = fifth bit of element 4l+k of row r
//! ```

use std::ops::Range;

use blink_gguf::GgmlType;

use super::GROUP;

/// Where each field sits in one original block, and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub block: usize,
    /// Bytes of the block's scale at its start: 2 (`d`, f16) or 1 (`MXFP4`'s exponent).
    pub scale: usize,
    /// Offset of the minimum `m` (f16), if any.
    pub m: Option<usize>,
    /// Offset of the 32-bit fifth-bit word, if any.
    pub qh: Option<usize>,
    pub qs: usize,
    /// Bits per stored quant (4 or 8).
    pub bits: usize,
}

impl Fields {
    /// [`Fields::of`] a type a kernel is written for: a compile-time error if it has none.
    pub const fn of_packable(ty: GgmlType) -> Fields {
        match Fields::of(ty) {
            Some(f) => f,
            None => panic!("not a packable type"),
        }
    }

    /// The fields of a packable type, or `None`.
    pub const fn of(ty: GgmlType) -> Option<Fields> {
        const fn f(block: usize, m: Option<usize>, qh: Option<usize>, qs: usize, bits: usize) -> Option<Fields> {
            Some(Fields { block, scale: 2, m, qh, qs, bits })
        }
        match ty {
            // IQ4_NL's nibbles index a table; stored as Q4_0's.
            GgmlType::Q4_0 | GgmlType::IQ4_NL => f(18, None, None, 2, 4),
            GgmlType::Q4_1 => f(20, Some(2), None, 4, 4),
            GgmlType::Q5_0 => f(22, None, Some(2), 6, 4),
            GgmlType::Q5_1 => f(24, Some(2), Some(4), 8, 4),
            GgmlType::Q8_0 => f(34, None, None, 2, 8),
            GgmlType::MXFP4 => Some(Fields { block: 17, scale: 1, m: None, qh: None, qs: 1, bits: 4 }),
            _ => None,
        }
    }

    /// Offsets of the fields inside one packed group-block: (m, qh, quants).
    pub const fn packed_offsets(&self) -> (usize, usize, usize) {
        let m = self.scale * GROUP;
        let qh = m + if self.m.is_some() { 2 * GROUP } else { 0 };
        let qs = qh + if self.qh.is_some() { 4 * GROUP } else { 0 };
        (m, qh, qs)
    }

    /// Bytes of one group-block.
    pub const fn group_block(&self) -> usize {
        GROUP * self.block
    }

    /// Quant `e` (0..32) of an original block, without its fifth bit.
    fn quant(&self, blk: &[u8], e: usize) -> u8 {
        if self.bits == 8 {
            blk[self.qs + e]
        } else if e < 16 {
            blk[self.qs + e] & 0x0f
        } else {
            blk[self.qs + e - 16] >> 4
        }
    }
}

/// Or the original blocks of rows `0..8` (`None`: a zero padding row) of a format with
/// fifth bits into one zeroed group-block `dst`.
fn pack_group_block(f: &Fields, blocks: [Option<&[u8]>; GROUP], dst: &mut [u8]) {
    let (m_at, qh_at, qs_at) = f.packed_offsets();
    for (r, blk) in blocks.iter().enumerate() {
        let Some(blk) = blk else { continue };
        let sc = f.scale;
        dst[sc * r..sc * (r + 1)].copy_from_slice(&blk[..sc]);
        if let Some(m) = f.m {
            dst[m_at + 2 * r..m_at + 2 * r + 2].copy_from_slice(&blk[m..m + 2]);
        }
        let qh = f.qh.map(|o| u32::from_le_bytes([blk[o], blk[o + 1], blk[o + 2], blk[o + 3]]));
        for l in 0..8 {
            for k in 0..4 {
                let e = 4 * l + k;
                let q = f.quant(blk, e);
                if f.bits == 8 {
                    dst[qs_at + 32 * l + 4 * r + k] = q;
                } else {
                    dst[qs_at + 32 * (l % 4) + 4 * r + k] |= q << (4 * (l / 4));
                }
                if let Some(qh) = qh {
                    let bit = (qh >> e) & 1;
                    let at = qh_at + 4 * l + (4 * r + k) / 8;
                    dst[at] |= (bit as u8) << ((4 * r + k) % 8);
                }
            }
        }
    }
}

/// Rebuild row `r`'s original block from a group-block (the inverse of packing).
pub fn unpack_block(f: &Fields, src: &[u8], r: usize, blk: &mut [u8]) {
    let (m_at, qh_at, qs_at) = f.packed_offsets();
    blk[..f.block].fill(0);
    blk[..f.scale].copy_from_slice(&src[f.scale * r..f.scale * (r + 1)]);
    if let Some(m) = f.m {
        blk[m..m + 2].copy_from_slice(&src[m_at + 2 * r..m_at + 2 * r + 2]);
    }
    let mut qh = 0u32;
    for l in 0..8 {
        for k in 0..4 {
            let e = 4 * l + k;
            let q = if f.bits == 8 {
                src[qs_at + 32 * l + 4 * r + k]
            } else {
                (src[qs_at + 32 * (l % 4) + 4 * r + k] >> (4 * (l / 4))) & 0x0f
            };
            if f.bits == 8 {
                blk[f.qs + e] = q;
            } else if e < 16 {
                blk[f.qs + e] |= q;
            } else {
                blk[f.qs + e - 16] |= q << 4;
            }
            if f.qh.is_some() {
                let i = 4 * r + k;
                qh |= (((src[qh_at + 4 * l + i / 8] >> (i % 8)) & 1) as u32) << e;
            }
        }
    }
    if let Some(o) = f.qh {
        blk[o..o + 4].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Pack rows `rows` (at most [`GROUP`]) of the row-major matrix `src`, `cols` elements a
/// row, into one group `dst` (every block of the group; missing rows are zeros). The row
/// kernels of the 32-element formats pack each group this way on the fly, into a buffer
/// that stays in L1, when a matrix is left in the file's layout (a mapped or streamed
/// window).
pub fn pack_group(f: &Fields, cols: usize, src: &[u8], rows: Range<usize>, dst: &mut [u8]) {
    let n_blocks = cols / 32;
    let row_bytes = n_blocks * f.block;
    assert!(rows.len() <= GROUP && src.len() >= rows.end * row_bytes, "pack: rows outside the source");
    assert_eq!(dst.len(), n_blocks * f.group_block(), "pack: a group of the wrong size");
    if f.qh.is_none() {
        if rows.len() < GROUP {
            dst.fill(0);
        }
        // SAFETY: the asserts above bound every row's blocks inside `src` and every
        // group-block inside `dst`.
        unsafe { pack_group_whole_lanes(f, n_blocks, src.as_ptr().add(rows.start * row_bytes), row_bytes, rows.len(), dst.as_mut_ptr()) };
        return;
    }
    // Fifth bits are or-ed in: start from zeros (the buffer may hold an earlier group).
    dst.fill(0);
    for (b, gb) in dst.chunks_exact_mut(f.group_block()).enumerate() {
        let blocks = std::array::from_fn(|r| (r < rows.len()).then(|| &src[(rows.start + r) * row_bytes + b * f.block..][..f.block]));
        pack_group_block(f, blocks, gb);
    }
}

/// [`pack_group`] for formats without fifth bits, whose lanes are four bytes moved whole:
/// an 8-bit lane `l` is bytes `4l..4l+4`, and a 4-bit vector `l` (low nibbles lane `l`,
/// high nibbles lane `l + 4`) is the block's own bytes `4l..4l+4`.
///
/// # Safety
/// `src` must hold `live` rows of `row_bytes`, and `dst` `n_blocks` group-blocks.
unsafe fn pack_group_whole_lanes(f: &Fields, n_blocks: usize, src: *const u8, row_bytes: usize, live: usize, dst: *mut u8) {
    let (m_at, _, qs_at) = f.packed_offsets();
    let lanes = if f.bits == 8 { 8 } else { 4 };
    // In the source's order: a group's rows are one run of memory.
    for r in 0..live {
        for b in 0..n_blocks {
            let gb = dst.add(b * f.group_block());
            let blk = src.add(r * row_bytes + b * f.block);
            std::ptr::copy_nonoverlapping(blk, gb.add(f.scale * r), f.scale);
            if let Some(m) = f.m {
                gb.add(m_at + 2 * r).cast::<u16>().write_unaligned(blk.add(m).cast::<u16>().read_unaligned());
            }
            for l in 0..lanes {
                let lane = blk.add(f.qs + 4 * l).cast::<u32>().read_unaligned();
                gb.add(qs_at + 32 * l + 4 * r).cast::<u32>().write_unaligned(lane);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::pack::pack;

    #[test]
    fn unpacking_restores_every_block() {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::MXFP4] {
            let f = Fields::of(ty).unwrap();
            let (rows, cols) = (13, 96);
            let src: Vec<u8> = (0..rows * cols / 32 * ty.type_size()).map(|i| (i * 7 + 3) as u8).collect();
            let packed = pack(ty, rows, cols, &src).unwrap();
            assert_eq!(packed.len(), 16 * cols / 32 * ty.type_size());
            let n_blocks = cols / 32;
            let mut blk = [0u8; 34];
            for row in 0..16 {
                for b in 0..n_blocks {
                    let gb = &packed[((row / 8) * n_blocks + b) * f.group_block()..][..f.group_block()];
                    unpack_block(&f, gb, row % 8, &mut blk);
                    let want: Vec<u8> = if row < rows {
                        src[row * n_blocks * f.block + b * f.block..][..f.block].to_vec()
                    } else {
                        vec![0; f.block]
                    };
                    assert_eq!(&blk[..f.block], &want[..], "{ty} row {row} block {b}");
                }
            }
        }
        assert!(pack(GgmlType::Q8_1, 8, 256, &[0; 8 * 8 * 36]).is_none());
    }
}
