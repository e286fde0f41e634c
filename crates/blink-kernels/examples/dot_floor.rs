//! Dev tool: the instruction floor of the 32-element formats' products on this CPU, on the
//! AVX-512 VNNI path and on plain AVX2.
//!
//! In the `llama` order every 32 products cost one `dpbusd` (AVX2: `maddubs` + `madd`),
//! one convert and one FMA (see `gemm::x86_fam32`); in the block order the 32 products add
//! into an integer sum, and the convert and FMA come once per block (per 256 products of a
//! tile row). This times those instructions alone, in independent chains with nothing to
//! load, and prints the multiply-accumulates per second they allow: the most any packed
//! kernel in that order can reach on one core. Compare `gemm_stream`'s figures with it.
//! `dpbusd` and FMA are also timed alone, which shows whether they share pipes (on Zen 4
//! they do: together they run at half the rate of either), and with the activation
//! broadcast from memory as the kernel does (free on Zen 4: a load alone).
//! `cargo run --release -p blink-kernels --example dot_floor`.

#[cfg(target_arch = "x86_64")]
mod floor {
    use std::arch::x86_64::*;
    use std::hint::black_box;
    use std::time::Instant;

    /// Loop trips per timing; each trip issues eight of the measured groups.
    const TRIPS: usize = 50_000_000;

    /// The mixes timed: `dpbusd` alone, FMA alone, the two with a convert between, and
    /// that with the activation broadcast from memory (as the kernel loads it).
    pub const DPBUSD: u8 = 0;
    pub const FMA: u8 = 1;
    pub const DPBUSD_CVT_FMA: u8 = 2;
    pub const WITH_BROADCAST: u8 = 3;

    /// Groups (one of mix `M`) per second, eight independent chains.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
    pub unsafe fn rate<const M: u8>() -> f64 {
        let (w, a) = (black_box(_mm256_set1_epi8(3)), black_box(_mm256_set1_epi8(5)));
        let s = black_box(_mm256_set1_ps(1e-9));
        let buf: Vec<i32> = (0..8192).map(|i| i * 7 + 1).collect();
        let mut i = [_mm256_setzero_si256(); 8];
        let mut f = [_mm256_setzero_ps(); 8];
        let t = Instant::now();
        for trip in 0..TRIPS {
            let p = buf.as_ptr().add((trip & 127) * 64);
            for k in 0..8 {
                let a = if M == WITH_BROADCAST { _mm256_set1_epi32(p.add(k).read()) } else { a };
                match M {
                    DPBUSD => i[k] = _mm256_dpbusd_epi32(i[k], w, a),
                    FMA => f[k] = _mm256_fmadd_ps(s, s, f[k]),
                    _ => {
                        // The sums chain too, so nothing is loop-invariant.
                        i[k] = _mm256_dpbusd_epi32(i[k], w, a);
                        f[k] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(i[k]), f[k]);
                    }
                }
            }
        }
        let secs = t.elapsed().as_secs_f64();
        black_box((i, f));
        (8 * TRIPS) as f64 / secs
    }

    /// The AVX2 mixes: `maddubs` + `madd` per 32 products, then a convert and an FMA
    /// (`llama` order) or an integer add into the block's sum (block order; its convert
    /// and FMA per block are left out, an eighth of the rest).
    pub const AVX2_LLAMA: u8 = 0;
    pub const AVX2_BLOCK: u8 = 1;

    /// Groups of 32 products (mix `M`) per second on plain AVX2, eight independent chains.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn rate_avx2<const M: u8>() -> f64 {
        let (w, a) = (black_box(_mm256_set1_epi8(3)), black_box(_mm256_set1_epi8(5)));
        let ones = _mm256_set1_epi16(1);
        let s = black_box(_mm256_set1_ps(1e-9));
        let buf: Vec<i32> = (0..8192).map(|i| i * 7 + 1).collect();
        let mut i = [_mm256_setzero_si256(); 8];
        let mut f = [_mm256_setzero_ps(); 8];
        let t = Instant::now();
        for trip in 0..TRIPS {
            let p = buf.as_ptr().add((trip & 127) * 64);
            for k in 0..8 {
                // The activation broadcast from memory, as the kernel loads it, so nothing
                // is loop-invariant.
                let a = _mm256_xor_si256(a, _mm256_set1_epi32(p.add(k).read()));
                let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones);
                if M == AVX2_LLAMA {
                    f[k] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(sums), f[k]);
                } else {
                    i[k] = _mm256_add_epi32(i[k], sums);
                }
            }
        }
        let secs = t.elapsed().as_secs_f64();
        black_box((i, f));
        (8 * TRIPS) as f64 / secs
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    use blink_kernels::cpu::Isa;
    use floor::*;
    // SAFETY (every `rate` below): each mix runs only where the CPU has its features.
    let median = |rate: unsafe fn() -> f64| {
        let mut r: Vec<f64> = (0..5).map(|_| unsafe { rate() }).collect();
        r.sort_by(|a, b| a.total_cmp(b));
        r[2]
    };
    if Isa::Avx2.supported() {
        let (llama, block) = (median(rate_avx2::<AVX2_LLAMA>), median(rate_avx2::<AVX2_BLOCK>));
        println!("AVX2, llama order (maddubs + madd + cvt + FMA): {:.2} G/s = {:.1} GMAC/s per core", llama / 1e9, llama * 32.0 / 1e9);
        println!("AVX2, block order (maddubs + madd + add):       {:.2} G/s = {:.1} GMAC/s per core", block / 1e9, block * 32.0 / 1e9);
    }
    if !Isa::Avx512Vnni.supported() {
        println!("this CPU has no AVX-512 VNNI");
        return;
    }
    let (dot, fma, both) = (median(rate::<DPBUSD>), median(rate::<FMA>), median(rate::<DPBUSD_CVT_FMA>));
    let loaded = median(rate::<WITH_BROADCAST>);
    println!("dpbusd alone:          {:.2} G/s", dot / 1e9);
    println!("FMA alone:             {:.2} G/s", fma / 1e9);
    println!("dpbusd + cvt + FMA:    {:.2} G/s = {:.1} GMAC/s per core (32 products each; median of 5)", both / 1e9, both * 32.0 / 1e9);
    println!("  with a broadcast load: {:.2} G/s", loaded / 1e9);
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("the floor is measured for the x86 paths only");
}
