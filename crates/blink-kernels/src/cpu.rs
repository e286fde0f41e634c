//! Which instruction-set path the kernels use, chosen once at start-up.
//!
//! Detection reads the CPU's features; `BLINK_KERNEL=scalar|avx2|avx-vnni|avx512|neon|neon-i8mm` (or
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
    /// x86-64 AVX2 with AVX-VNNI (`vpdpbusd` on 256-bit vectors, VEX-encoded: Intel from
    /// Alder Lake, AMD from Zen 5), sixteen registers as plain AVX2.
    AvxVnni,
    /// x86-64 AVX-512 with VNNI (used on 256-bit vectors through AVX-512VL).
    Avx512Vnni,
    /// AArch64 NEON with the dot-product extension.
    Neon,
    /// NEON with the int8 matrix-multiply extension too (`smmla`: a 2×8 by 8×2 product
    /// of bytes; Arm from Neoverse V1/N2 and Cortex-A510/A710, Apple from M2): the block
    /// order of the 32-element formats runs on it, everything else as on `Neon`.
    NeonI8mm,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Neon => "neon",
            Isa::NeonI8mm => "neon-i8mm",
        }
    }

    /// Parse a user's choice (`avx512` is accepted for `avx512-vnni`).
    pub fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx-vnni" | "avxvnni" => Some(Isa::AvxVnni),
            "avx512" | "avx512-vnni" | "avx512vnni" => Some(Isa::Avx512Vnni),
            "neon" => Some(Isa::Neon),
            "neon-i8mm" | "i8mm" => Some(Isa::NeonI8mm),
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
            Isa::AvxVnni => Isa::Avx2.supported() && is_x86_feature_detected!("avxvnni"),
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
            #[cfg(target_arch = "aarch64")]
            Isa::NeonI8mm => Isa::Neon.supported() && std::arch::is_aarch64_feature_detected!("i8mm"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every SIMD path, best first.
    pub const SIMD: [Isa; 5] = [Isa::Avx512Vnni, Isa::AvxVnni, Isa::Avx2, Isa::NeonI8mm, Isa::Neon];

    /// The best path this CPU supports.
    pub fn best() -> Isa {
        Isa::SIMD.into_iter().find(|i| i.supported()).unwrap_or(Isa::Scalar)
    }

    /// The SIMD paths this CPU supports, best first.
    pub fn simd_supported() -> Vec<Isa> {
        Isa::SIMD.into_iter().filter(|i| i.supported()).collect()
    }

    /// Whether this is an x86 path (AVX2 and up): every one runs the AVX2 + FMA + F16C
    /// kernels where it has nothing better.
    pub fn is_x86(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni)
    }

    /// Whether this is an AArch64 path: every one runs the NEON + dotprod kernels where
    /// it has nothing better.
    pub fn is_arm(self) -> bool {
        matches!(self, Isa::Neon | Isa::NeonI8mm)
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
    #[error("unknown kernel path '{0}' (use scalar, avx2, avx-vnni, avx512, neon or neon-i8mm)")]
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

/// The SIMD features this CPU reports that some kernel path uses (x86: AVX2, FMA, F16C,
/// AVX-512 F/BW/VL/VNNI, AVX-VNNI; AArch64: NEON, dotprod, i8mm, fp16).
pub fn features() -> Vec<&'static str> {
    let mut found = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => {$(
                if is_x86_feature_detected!($f) {
                    found.push($f);
                }
            )*};
        }
        probe!("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avxvnni");
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => {$(
                if std::arch::is_aarch64_feature_detected!($f) {
                    found.push($f);
                }
            )*};
        }
        probe!("neon", "dotprod", "i8mm", "fp16");
    }
    found
}

/// One CPU cache as Linux describes it for CPU 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cache {
    pub level: u32,
    /// `Data`, `Instruction` or `Unified`.
    pub kind: String,
    pub bytes: u64,
    /// CPUs that share it.
    pub shared_by: usize,
}

/// CPU 0's caches from `/sys/devices/system/cpu/cpu0/cache` (empty where that is
/// missing, as off Linux).
pub fn caches() -> Vec<Cache> {
    let root = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let read = |dir: &std::path::Path, name: &str| std::fs::read_to_string(dir.join(name)).ok().map(|s| s.trim().to_string());
    let mut out = Vec::new();
    for i in 0.. {
        let dir = root.join(format!("index{i}"));
        let (Some(level), Some(kind), Some(size)) = (read(&dir, "level"), read(&dir, "type"), read(&dir, "size")) else { break };
        let bytes = match size.strip_suffix('K').or_else(|| size.strip_suffix("KB")) {
            Some(k) => k.parse::<u64>().ok().map(|k| k << 10),
            None => match size.strip_suffix('M').or_else(|| size.strip_suffix("MB")) {
                Some(m) => m.parse::<u64>().ok().map(|m| m << 20),
                None => size.parse().ok(),
            },
        };
        let shared_by = read(&dir, "shared_cpu_list").map_or(1, |list| cpu_count(&list));
        if let (Ok(level), Some(bytes)) = (level.parse(), bytes) {
            out.push(Cache { level, kind, bytes, shared_by });
        }
    }
    out
}

/// CPUs in a Linux CPU list (`0-3,8,10-11`).
fn cpu_count(list: &str) -> usize {
    list.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('-') {
            Some((a, b)) => b.trim().parse::<usize>().unwrap_or(0).saturating_sub(a.trim().parse().unwrap_or(0)) + 1,
            None => 1,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_scalar_always_works() {
        for isa in [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni, Isa::Neon, Isa::NeonI8mm] {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert!(Isa::Scalar.supported());
        assert!(Isa::best().supported());
        assert_eq!(Isa::parse("sse9"), None);
    }

    #[test]
    fn cpu_lists_count() {
        assert_eq!(cpu_count("0"), 1);
        assert_eq!(cpu_count("0-3,8,10-11"), 7);
        assert_eq!(cpu_count(""), 0);
    }

    #[test]
    fn the_best_path_has_its_features() {
        let f = features();
        match Isa::best() {
            Isa::Avx512Vnni => assert!(["avx2", "fma", "f16c", "avx512vnni"].iter().all(|x| f.contains(x)), "{f:?}"),
            Isa::AvxVnni => assert!(["avx2", "fma", "f16c", "avxvnni"].iter().all(|x| f.contains(x)), "{f:?}"),
            Isa::Avx2 => assert!(["avx2", "fma", "f16c"].iter().all(|x| f.contains(x)), "{f:?}"),
            Isa::Neon => assert!(f.contains(&"dotprod"), "{f:?}"),
            Isa::NeonI8mm => assert!(f.contains(&"dotprod") && f.contains(&"i8mm"), "{f:?}"),
            Isa::Scalar => {}
        }
    }
}
