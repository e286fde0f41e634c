//! Tiled rows ([`super::RowForm::tiled`]) on the paths without a tiled kernel: each weight
//! row's super-blocks decoded once ([`TiledWeights`]), then taken against every activation
//! row with plain integer loops, in the steps of [`crate::quant::vec_dot_tiled`].

use std::cell::RefCell;
use std::ops::Range;

use blink_gguf::QK_K;

use super::{pack, ActRows, Layout, MatRef, Out};
use crate::flavour::Flavour;
use crate::quant::{Block, BlockQ8K, TiledWeights};

thread_local! {
    /// One weight row, decoded (and, from a packed layout, first put back together);
    /// reused, so steady state does not allocate.
    static ROW: RefCell<(Vec<TiledWeights>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `out[r][i] (+)= w_i · a_r` for weight rows `i` in `rows`, every activation row tiled.
///
/// # Safety
/// As [`super::product`].
pub(super) unsafe fn product(flavour: Flavour, m: &MatRef, a: &ActRows, rows: Range<usize>, out: Out) {
    let MatRef { ty, layout, cols, bytes: w, .. } = *m;
    let (nb, wb) = (cols / QK_K, ty.type_size());
    let row_bytes = nb * wb;
    ROW.with_borrow_mut(|(decoded, unpacked)| {
        for i in rows {
            let row = match layout {
                Layout::RowMajor => &w[i * row_bytes..(i + 1) * row_bytes],
                Layout::Packed => {
                    unpacked.resize(row_bytes, 0);
                    pack::unpack_row(ty, cols, w, i, unpacked);
                    &unpacked[..]
                }
            };
            decoded.clear();
            decoded.extend(row.chunks_exact(wb).map(|b| TiledWeights::decode(ty, b)));
            for r in 0..a.count {
                let act = &a.bytes[r * a.stride..];
                let v = decoded.iter().enumerate().fold(0f32, |acc, (b, weights)| {
                    let x = BlockQ8K::read(&act[b * BlockQ8K::BYTES..]);
                    weights.against(flavour, &x).add_to(acc, x.d)
                });
                super::store(out, r, i, v);
            }
        }
    });
}
