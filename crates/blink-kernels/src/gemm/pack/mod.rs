//! Interleaved weight layouts for the SIMD kernels: rows in groups of eight, each block
//! index of a group holding the eight rows' blocks side by side, so that one vector holds
//! the same few elements of eight rows and one product against a broadcast activation
//! gives eight outputs at once. One door for every format that has such a layout:
//! [`pack`], [`packed_len`], [`pack_into`] and [`unpack_row`].
//!
//! - The 32-element formats ([`fam32`]: [`Fields`]): scales side by side, then the quants
//!   lane-major (lanes of four elements), the fifth bits gathered per lane.
//! - The super-block formats, the k-quants and `IQ4_XS` ([`superblock`]: [`SuperFields`]):
//!   every field of the block transposed in units (a scale's two bytes, a byte of packed
//!   scales, four bytes of quants), so unit `i` of row `r` sits at `unit · (8i + r)` in
//!   the field's place, which is eight times its place in the block.
//!
//! Either way a group-block holds exactly the bytes of eight original blocks: a packed
//! matrix is as large as the file's (plus zero rows up to a whole group).

use blink_gguf::GgmlType;

mod fam32;
mod superblock;

pub use fam32::{pack_group, unpack_block, Fields};
pub use superblock::SuperFields;

/// Rows per interleaved group.
pub const GROUP: usize = 8;

/// Rows rounded up to whole groups.
pub fn padded_rows(rows: usize) -> usize {
    rows.div_ceil(GROUP) * GROUP
}

/// Bytes of one group-block of `ty` (eight blocks), if `ty` has an interleaved layout.
pub fn group_block(ty: GgmlType) -> Option<usize> {
    Fields::of(ty).map(|f| f.group_block()).or_else(|| SuperFields::of(ty).map(|f| f.group_block()))
}

/// Repack a row-major matrix of `rows` × `cols` elements of `ty` into its interleaved
/// layout, or `None` if `ty` has none.
pub fn pack(ty: GgmlType, rows: usize, cols: usize, src: &[u8]) -> Option<Vec<u8>> {
    let mut out = vec![0u8; packed_len(ty, rows, cols)?];
    pack_into(ty, rows, cols, src, &mut out);
    Some(out)
}

/// Bytes of `rows` rows of `cols` elements of `ty` packed, or `None` for a type that is
/// not packed.
pub fn packed_len(ty: GgmlType, rows: usize, cols: usize) -> Option<usize> {
    Some(padded_rows(rows) / GROUP * (cols / ty.block_size()) * group_block(ty)?)
}

/// [`pack`] into `out`, which must hold [`packed_len`] bytes; `false` for a type that is
/// not packed.
pub fn pack_into(ty: GgmlType, rows: usize, cols: usize, src: &[u8], out: &mut [u8]) -> bool {
    let Some(gb) = group_block(ty) else { return false };
    let n_blocks = cols / ty.block_size();
    assert!(cols.is_multiple_of(ty.block_size()) && src.len() >= rows * n_blocks * ty.type_size(), "pack: source shorter than its rows");
    assert_eq!(Some(out.len()), packed_len(ty, rows, cols), "pack: destination of the wrong size");
    for (g, dst) in out.chunks_exact_mut(n_blocks * gb).enumerate() {
        let live = g * GROUP..(g * GROUP + GROUP).min(rows);
        match (Fields::of(ty), SuperFields::of(ty)) {
            (Some(f), _) => pack_group(&f, cols, src, live, dst),
            (_, Some(f)) => f.pack_group(n_blocks, src, live, dst),
            _ => unreachable!("a type with a group-block"),
        }
    }
    true
}

/// Row `row`'s original blocks (`cols` elements of `ty`, the file's bytes) rebuilt from
/// the packed matrix `packed` into `out` (one row's bytes): the inverse of [`pack`], for
/// the reference kernels and the float products' fills.
pub fn unpack_row(ty: GgmlType, cols: usize, packed: &[u8], row: usize, out: &mut [u8]) {
    let gb = group_block(ty).expect("a packed type");
    let (n_blocks, bytes) = (cols / ty.block_size(), ty.type_size());
    let group = &packed[row / GROUP * n_blocks * gb..][..n_blocks * gb];
    for (b, blk) in out[..n_blocks * bytes].chunks_exact_mut(bytes).enumerate() {
        unpack_block_of(ty, &group[b * gb..][..gb], row % GROUP, blk);
    }
}

/// Row `r`'s original block of `ty` rebuilt from the group-block `src`.
pub fn unpack_block_of(ty: GgmlType, src: &[u8], r: usize, blk: &mut [u8]) {
    match (Fields::of(ty), SuperFields::of(ty)) {
        (Some(f), _) => unpack_block(&f, src, r, blk),
        (_, Some(f)) => f.unpack_block(src, r, blk),
        _ => panic!("{ty} has no interleaved layout"),
    }
}
