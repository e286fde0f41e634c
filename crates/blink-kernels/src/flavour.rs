//! Which build of llama.cpp the llama order reproduces, chosen once at start-up.
//!
//! llama.cpp is not one definition on x86: ggml's float code is written over the widest
//! vectors the build allows, so a build for AVX-512 and one for AVX2 round some float
//! results differently. Where they differ (the f16/f32 dot products of attention and of
//! f32 routers, the vectorised `exp` of SiLU and of softmax; the integer parts of the
//! quantized dots and every k-quant kernel agree), Blink's definitions come in both
//! flavours:
//!
//! * [`Flavour::Avx512`]: the AVX-512 build's (16-lane steps, `_mm512_reduce_add_ps`,
//!   an `exp` scaled by `vscalefps`);
//! * [`Flavour::Avx2`]: the AVX2 build's (8-lane steps, the `hadd` reduction, an `exp`
//!   scaled by an FMA with `2^n`).
//!
//! By default the flavour follows the kernel path, so `--dot-order llama` gives what
//! llama.cpp computes on this CPU: the AVX-512-VNNI path takes the AVX-512 build's, the
//! AVX2 and AVX-VNNI paths the AVX2 build's (llama.cpp built for AVX-VNNI uses it only in
//! integer products, which are exact), and the scalar path that of the best path this CPU
//! has. The NEON paths keep the AVX-512 build's definitions (llama.cpp's ARM build is a
//! third definition, not reproduced). `BLINK_LLAMA_FLAVOUR=avx2|avx512` (or [`force`],
//! behind the CLI's `--llama-flavour`) picks one on any path. Every path computes either
//! flavour's exact bits. The block order (`crate::order`) is Blink's own and the same on
//! every CPU: with it the float definitions are always the AVX-512 build's.
//!
//! Not in either flavour yet: the products of `F32`/`F16`/`BF16` weight matrices keep the
//! AVX-512 build's order (their SIMD kernels, in `gemm`, have no other), and `Q2_K`, which
//! llama.cpp's AVX-512 build repacks (`q2_K_8x8`) and its AVX2 build does not, keeps one
//! order in both.

use std::fmt;
use std::sync::OnceLock;

use crate::cpu::{self, Isa};
use crate::order::{self, DotOrder};

/// Which llama.cpp build's float definitions the llama order follows (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flavour {
    /// llama.cpp built for AVX-512 (`-march=native` on an AVX-512 CPU).
    Avx512,
    /// llama.cpp built for AVX2 + FMA + F16C, without AVX-512.
    Avx2,
}

impl Flavour {
    pub const ALL: [Flavour; 2] = [Flavour::Avx512, Flavour::Avx2];

    pub fn name(self) -> &'static str {
        match self {
            Flavour::Avx512 => "avx512",
            Flavour::Avx2 => "avx2",
        }
    }

    pub fn parse(s: &str) -> Option<Flavour> {
        match s.trim().to_ascii_lowercase().as_str() {
            "avx512" | "avx-512" => Some(Flavour::Avx512),
            "avx2" => Some(Flavour::Avx2),
            _ => None,
        }
    }

    /// The build a user would compare against: `llama.cpp's AVX2 build`.
    pub fn build(self) -> &'static str {
        match self {
            Flavour::Avx512 => "llama.cpp's AVX-512 build",
            Flavour::Avx2 => "llama.cpp's AVX2 build",
        }
    }

    /// The flavour of kernel path `isa`: what llama.cpp computes on a CPU whose best
    /// path that is (for the scalar path, this CPU's best).
    pub fn of(isa: Isa) -> Flavour {
        match isa {
            Isa::Avx2 | Isa::AvxVnni => Flavour::Avx2,
            Isa::Avx512Vnni | Isa::Neon | Isa::NeonI8mm => Flavour::Avx512,
            Isa::Scalar => match Isa::best() {
                Isa::Scalar => Flavour::Avx512,
                best => Flavour::of(best),
            },
        }
    }
}

impl fmt::Display for Flavour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The flavour in use, and whether it was asked for (forced or `BLINK_LLAMA_FLAVOUR`)
/// rather than taken from the kernel path.
static ACTIVE: OnceLock<(Flavour, bool)> = OnceLock::new();

/// Why a flavour cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FlavourError {
    #[error("unknown llama.cpp flavour '{0}' (use avx2 or avx512)")]
    Unknown(String),
    #[error("the llama.cpp flavour is already fixed to {0}")]
    AlreadySet(Flavour),
}

/// Fix the flavour before first use. Fails if another one is already in use.
pub fn force(flavour: Flavour) -> Result<(), FlavourError> {
    let (chosen, _) = *ACTIVE.get_or_init(|| (flavour, true));
    if chosen == flavour {
        Ok(())
    } else {
        Err(FlavourError::AlreadySet(chosen))
    }
}

/// The flavour in use: with the block order the AVX-512 build's; else forced, else
/// `BLINK_LLAMA_FLAVOUR`, else that of the kernel path in use ([`Flavour::of`]
/// [`cpu::active`]).
///
/// An unknown `BLINK_LLAMA_FLAVOUR` value falls back to the kernel path's with a warning
/// on stderr.
pub fn active() -> Flavour {
    match order::active() {
        DotOrder::Block => Flavour::Avx512,
        DotOrder::Llama => ACTIVE.get_or_init(from_env).0,
    }
}

/// Whether the flavour in use was asked for (forced or `BLINK_LLAMA_FLAVOUR`) rather than
/// taken from the kernel path.
pub fn asked_for() -> bool {
    ACTIVE.get_or_init(from_env).1
}

fn from_env() -> (Flavour, bool) {
    match std::env::var("BLINK_LLAMA_FLAVOUR") {
        Ok(v) if !v.is_empty() => match Flavour::parse(&v) {
            Some(f) => (f, true),
            None => {
                eprintln!("blink: BLINK_LLAMA_FLAVOUR: {}; using the kernel path's", FlavourError::Unknown(v));
                (Flavour::of(cpu::active()), false)
            }
        },
        _ => (Flavour::of(cpu::active()), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Flavour::ALL {
            assert_eq!(Flavour::parse(f.name()), Some(f));
        }
        assert_eq!(Flavour::parse("sse"), None);
    }

    #[test]
    fn each_path_has_its_builds_flavour() {
        assert_eq!(Flavour::of(Isa::Avx2), Flavour::Avx2);
        assert_eq!(Flavour::of(Isa::AvxVnni), Flavour::Avx2);
        assert_eq!(Flavour::of(Isa::Avx512Vnni), Flavour::Avx512);
        assert_eq!(Flavour::of(Isa::Neon), Flavour::Avx512);
        let best = Isa::best();
        assert_eq!(Flavour::of(Isa::Scalar), if best == Isa::Scalar { Flavour::Avx512 } else { Flavour::of(best) });
    }
}
