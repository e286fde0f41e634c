//! Inputs shared by the benchmarks and the `gemm_stream` example.

/// `n` values in [-1, 1] from a xorshift stream: deterministic, full-mantissa test data.
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 20001) as f32 / 10000.0 - 1.0
        })
        .collect()
}
