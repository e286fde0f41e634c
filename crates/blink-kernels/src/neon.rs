//! AArch64 building blocks the kernels need but Rust's stable intrinsics (at the crate's
//! minimum Rust version) lack: the dot-product extension's `SDOT`, the int8 matrix
//! multiply's `SMMLA`, and conversions between four `f16` and four `f32` lanes. Each is
//! one instruction in inline assembly (`SDOT` after `.arch_extension dotprod`, `SMMLA`
//! after `.arch_extension i8mm`, so the assembler accepts them whatever the enclosing
//! function's target features; callers check the CPU has them).
//!
//! The conversions are the base ARMv8 `FCVTL`/`FCVTN` (no half-precision arithmetic
//! extension needed): widening is exact, narrowing rounds to nearest with ties to even
//! under the default floating-point control register, which Rust assumes and never
//! changes — exactly the rounding of `half::f16::from_f32` and of x86's F16C.

use std::arch::aarch64::*;
use std::arch::asm;

/// `acc + Σ a·b` per 32-bit lane: lane `i` adds the four products of bytes `4i..4i+4` of
/// the signed byte vectors `a` and `b`. The sums are exact (wrapping only past `i32`).
///
/// # Safety
/// The CPU must have the dot-product extension (`Isa::Neon` checks it).
#[inline(always)]
pub(crate) unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY (of the asm): a register-only instruction with no side effects; the caller
    // guarantees the CPU implements it.
    asm!(
        ".arch_extension dotprod",
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// As [`sdot`] with `b`'s 32-bit lane `lane` (0..4) broadcast: lane `i` of the result adds
/// the four products of bytes `4i..4i+4` of `a` with bytes `4·lane..4·lane+4` of `b`.
///
/// # Safety
/// The CPU must have the dot-product extension (`Isa::Neon` checks it).
#[inline(always)]
pub(crate) unsafe fn sdot_lane(acc: int32x4_t, a: int8x16_t, b: int8x16_t, lane: usize) -> int32x4_t {
    let mut acc = acc;
    macro_rules! at {
        ($l:literal) => {
            // SAFETY (of the asm): as in `sdot`.
            asm!(
                ".arch_extension dotprod",
                "sdot {acc:v}.4s, {a:v}.16b, {b:v}.4b[{l}]",
                acc = inout(vreg) acc,
                a = in(vreg) a,
                b = in(vreg) b,
                l = const $l,
                options(pure, nomem, nostack, preserves_flags)
            )
        };
    }
    match lane {
        0 => at!(0),
        1 => at!(1),
        2 => at!(2),
        _ => at!(3),
    }
    acc
}

/// `acc + a·bᵀ` for 2×8 byte matrices: `a` holds rows `a0` (bytes 0..8) and `a1` (8..16),
/// `b` rows `b0` and `b1`, and lane `2i + j` of the result adds `ai · bj` (eight signed
/// products). Exact, as [`sdot`].
///
/// # Safety
/// The CPU must have the int8 matrix-multiply extension (`Isa::NeonI8mm` checks it).
#[inline(always)]
pub(crate) unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY (of the asm): a register-only instruction with no side effects; the caller
    // guarantees the CPU implements it.
    asm!(
        ".arch_extension i8mm",
        "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// Four `f16` values (as bits) widened to `f32`, exactly.
#[inline(always)]
pub(crate) fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: FCVTL is a base AArch64 instruction on registers only.
    unsafe {
        asm!(
            "fcvtl {out:v}.4s, {h:v}.4h",
            out = lateout(vreg) out,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    out
}

/// Four `f32` values rounded to `f16` (to nearest, ties to even), as bits.
#[inline(always)]
pub(crate) fn f32_to_f16x4(v: float32x4_t) -> uint16x4_t {
    let out: uint16x4_t;
    // SAFETY: FCVTN is a base AArch64 instruction on registers only.
    unsafe {
        asm!(
            "fcvtn {out:v}.4h, {v:v}.4s",
            out = lateout(vreg) out,
            v = in(vreg) v,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    out
}

/// Four `f32` values rounded to the nearest `f16` value (ties to even) and back.
#[inline(always)]
pub(crate) fn round_f16(v: float32x4_t) -> float32x4_t {
    f16x4_to_f32(f32_to_f16x4(v))
}

/// Four little-endian `f16` values at `p` (any alignment), as `f32`.
///
/// # Safety
/// `p` must be valid for reading 8 bytes.
#[inline(always)]
pub(crate) unsafe fn load_f16x4(p: *const u8) -> float32x4_t {
    f16x4_to_f32(vreinterpret_u16_u8(vld1_u8(p)))
}

/// The little-endian `f16` at `p` (any alignment), as `f32` in every lane.
///
/// # Safety
/// `p` must be valid for reading 2 bytes.
#[inline(always)]
pub(crate) unsafe fn splat_f16(p: *const u8) -> float32x4_t {
    f16x4_to_f32(vdup_n_u16((p as *const u16).read_unaligned()))
}
