//! The AVX2 flavour of llama.cpp's definitions at the library level, in its own process
//! (the flavour and kernel path are fixed once per process): greedy ids against llama.cpp's
//! AVX2 build, on the AVX2 path where this CPU has it, else on the scalar path.

mod support;

use blink_kernels::cpu::{self, Isa};
use blink_kernels::flavour::{self, Flavour};

#[test]
fn avx2_flavour_ids_match_llama_cpps_avx2_build() {
    if Isa::Avx2.supported() {
        cpu::force(Isa::Avx2).unwrap();
    } else {
        eprintln!("note: this CPU has no avx2 path; the AVX2 flavour runs on the scalar path");
        cpu::force(Isa::Scalar).unwrap();
    }
    flavour::force(Flavour::Avx2).unwrap();
    support::greedy_ids_match_llama_cpp(Flavour::Avx2);
}
