//! Matrix products of quantized weights with quantized activation rows.
//!
//! `gemm` computes `out[r][i] (+)= w_i · a_r` for a range of weight rows `i` and every
//! activation row `r`, on the kernel path chosen by [`crate::cpu`]. Every path returns
//! exactly the scalar reference's bits ([`crate::quant::vec_dot`]), so a result never
//! depends on the CPU, the batch or the thread split.

use std::ops::Range;

use blink_gguf::GgmlType;

use crate::cpu::Isa;
use crate::quant;

#[cfg(target_arch = "x86_64")]
mod x86_fam32;

/// Where results go: element `(r, i)` is `ptr[r * ld + i]`, written or added.
#[derive(Clone, Copy)]
pub struct Out {
    pub ptr: *mut f32,
    pub ld: usize,
    pub accumulate: bool,
}

/// `out[r][i] (+)= w_i · a_r` for weight rows `i` in `rows` and activation rows `r` in
/// `0..n_act`. `w` holds the matrix row-major (`cols` elements of `ty` per row); `act` holds
/// `n_act` rows quantized to `vec_dot_type(ty)`, `act_stride` bytes apart.
///
/// # Safety
/// `out.ptr` must be valid for writes at every `(r, i)` above, and no other thread may
/// touch those elements during the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm(isa: Isa, ty: GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    if rows.is_empty() || n_act == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let done = match isa {
            Isa::Avx512Vnni => x86_fam32::gemm_vnni(ty, cols, w, rows.clone(), act, act_stride, n_act, out),
            Isa::Avx2 => x86_fam32::gemm_avx2(ty, cols, w, rows.clone(), act, act_stride, n_act, out),
            _ => false,
        };
        if done {
            return;
        }
    }
    let _ = isa;
    scalar(ty, cols, w, rows, act, act_stride, n_act, out);
}

/// The reference: one `vec_dot` per output.
#[allow(clippy::too_many_arguments)]
unsafe fn scalar(ty: GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    let rb = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
    let ab = quant::vec_dot_type(ty).row_bytes(cols as u64).expect("whole blocks") as usize;
    for i in rows {
        let wrow = &w[i * rb..(i + 1) * rb];
        for r in 0..n_act {
            let v = quant::vec_dot(ty, cols, wrow, &act[r * act_stride..r * act_stride + ab]);
            let o = out.ptr.add(r * out.ld + i);
            if out.accumulate {
                *o += v;
            } else {
                *o = v;
            }
        }
    }
}
