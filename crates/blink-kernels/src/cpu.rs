//! Which instruction-set path the kernels use, chosen once at start-up.
//!
//! Detection reads the CPU's features; `BLINK_KERNEL=scalar|avx2|avx512|neon` (or
//! [`force`], behind the CLI's `--kernel`) overrides it, for tests and for users whose
//! CPU misreports features. Asking for a path the CPU lacks is an error, never UB.

use std::fmt;
use std::sync::OnceLock;

/// A kernel path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable reference code (the test oracle).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 with VNNI (used on 256-bit vectors through AVX-512VL).
    Avx512Vnni,
    /// AArch64 NEON with the dot-product extension.
    Neon,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Neon => "neon",
        }
    }

    /// Parse a user's choice (`avx512` is accepted for `avx512-vnni`).
    pub fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512" | "avx512-vnni" | "avx512vnni" => Some(Isa::Avx512Vnni),
            "neon" => Some(Isa::Neon),
            _ => None,
        }
    }

    /// Whether this CPU can run the path.
    pub fn supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                Isa::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon") && std::arch::is_aarch64_feature_detected!("dotprod"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The best path this CPU supports.
    pub fn best() -> Isa {
        [Isa::Avx512Vnni, Isa::Avx2, Isa::Neon].into_iter().find(|i| i.supported()).unwrap_or(Isa::Scalar)
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

static ACTIVE: OnceLock<Isa> = OnceLock::new();

/// Why a path cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IsaError {
    #[error("unknown kernel path '{0}' (use scalar, avx2, avx512 or neon)")]
    Unknown(String),
    #[error("this CPU cannot run the {0} kernels")]
    Unsupported(Isa),
    #[error("the kernel path is already fixed to {0}")]
    AlreadySet(Isa),
}

/// Fix the path before first use. Fails if the CPU lacks it or a path is already in use.
pub fn force(isa: Isa) -> Result<(), IsaError> {
    if !isa.supported() {
        return Err(IsaError::Unsupported(isa));
    }
    let chosen = *ACTIVE.get_or_init(|| isa);
    if chosen == isa {
        Ok(())
    } else {
        Err(IsaError::AlreadySet(chosen))
    }
}

/// The path in use: forced, else `BLINK_KERNEL`, else the best supported.
///
/// An unusable `BLINK_KERNEL` value falls back to the best path with a warning on stderr.
pub fn active() -> Isa {
    *ACTIVE.get_or_init(|| match std::env::var("BLINK_KERNEL") {
        Ok(v) if !v.is_empty() => match Isa::parse(&v) {
            Some(isa) if isa.supported() => isa,
            Some(isa) => {
                eprintln!("blink: BLINK_KERNEL={v}: {}; using {}", IsaError::Unsupported(isa), Isa::best());
                Isa::best()
            }
            None => {
                eprintln!("blink: BLINK_KERNEL: {}; using {}", IsaError::Unknown(v), Isa::best());
                Isa::best()
            }
        },
        _ => Isa::best(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_scalar_always_works() {
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni, Isa::Neon] {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert!(Isa::Scalar.supported());
        assert!(Isa::best().supported());
        assert_eq!(Isa::parse("sse9"), None);
    }
}
