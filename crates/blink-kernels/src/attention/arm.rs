//! The AArch64 NEON kernels.

use std::arch::aarch64::*;

use super::{Online, Scale};
use crate::neon::{f16x4_to_f32, round_f16};

/// Sixteen lanes as four quarters.
type V16 = [float32x4_t; 4];

/// Four f16 values at `p` as f32.
#[inline(always)]
unsafe fn load4(p: *const u16) -> float32x4_t {
    f16x4_to_f32(vld1_u16(p))
}

/// [`crate::quant::reduce::hsum16`]: halves, then quarters, then (t0+t2) + (t1+t3).
#[inline(always)]
unsafe fn hsum16(v: V16) -> f32 {
    let t6 = vaddq_f32(vaddq_f32(v[3], v[1]), vaddq_f32(v[2], v[0]));
    let t8 = vaddq_f32(t6, vextq_f32::<2>(t6, t6));
    vgetq_lane_f32::<0>(t8) + vgetq_lane_f32::<1>(t8)
}

/// f16 keys and values, `hd` a multiple of 16: the x86 kernel's order on 4-lane vectors.
#[target_feature(enable = "neon")]
pub(super) unsafe fn attend_f16(q: &[f32], keys: &[u16], values: &[u16], n: usize, scale: Scale, state: &mut Online, acc: &mut [f32]) {
    let hd = q.len();
    let np = hd - hd % 64;
    for t in 0..n {
        let k = keys.as_ptr().add(t * hd);
        // Score: four 16-lane FMA accumulators over 64-element steps.
        let mut a = [[vdupq_n_f32(0.0); 4]; 4];
        let mut i = 0;
        while i < np {
            for (j, aj) in a.iter_mut().enumerate() {
                for (x, lane) in aj.iter_mut().enumerate() {
                    let e = i + 16 * j + 4 * x;
                    *lane = vfmaq_f32(*lane, vld1q_f32(q.as_ptr().add(e)), load4(k.add(e)));
                }
            }
            i += 64;
        }
        let folded: V16 = std::array::from_fn(|x| vaddq_f32(vaddq_f32(a[0][x], a[2][x]), vaddq_f32(a[1][x], a[3][x])));
        let mut sum = hsum16(folded) as f64;
        for (e, &qe) in q.iter().enumerate().skip(np) {
            sum += (qe * half::f16::from_bits(*k.add(e)).to_f32()) as f64;
        }
        let s = scale.cap(sum as f32 * scale.mul);

        let (ms, vs) = state.step(s);
        let v = values.as_ptr().add(t * hd);
        let (msv, vsv) = (vdupq_n_f32(ms), vdupq_n_f32(vs));
        let rescale = ms != 1.0;
        for d in (0..hd).step_by(4) {
            let ap = acc.as_mut_ptr().add(d);
            let mut x = vld1q_f32(ap);
            if rescale {
                x = round_f16(vmulq_f32(x, msv));
            }
            vst1q_f32(ap, round_f16(vfmaq_f32(x, load4(v.add(d)), vsv)));
        }
    }
}
