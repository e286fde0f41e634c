//! Greedy generation against llama.cpp's token ids, at the library level, reporting how far
//! past the owed prefix the two engines keep agreeing: against the build of llama.cpp whose
//! results this process's flavour reproduces (the default path's on this CPU, or
//! `BLINK_LLAMA_FLAVOUR`; greedy_golden_avx2.rs holds the AVX2 flavour to the AVX2 build).

mod support;

#[test]
fn greedy_ids_match_llama_cpp() {
    support::greedy_ids_match_llama_cpp(blink_kernels::flavour::active());
}
