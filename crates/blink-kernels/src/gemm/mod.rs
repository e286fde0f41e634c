//! Matrix products of quantized weights with quantized activation rows.
//!
//! A product is a call over values: a weight matrix ([`MatRef`]: type, layout, shape,
//! bytes), the activation rows it multiplies ([`ActRows`]: bytes, stride, count and their
//! format, which is the matrix's [`MatRef::activation_type`]), the weight rows to compute,
//! and where results go ([`Out`]). [`product`] computes `out[r][i] (+)= w_i · a_r` for
//! those weight rows `i` and every activation row `r`, on the kernel path chosen by
//! [`crate::cpu`] and in a [`DotOrder`]. Every path returns exactly the scalar reference's
//! bits ([`crate::quant::vec_dot`]), so a result never depends on the CPU, the batch or the
//! thread split. Further kernels over the same operands (adapters' low-rank products,
//! backward products) take these values too.
//!
//! Weights come either row-major, as in the file, or repacked by [`prepare`] into the
//! interleaved layouts of [`pack`] that the SIMD kernels read: the 32-element formats on
//! every SIMD path (on x86 they take row-major matrices too, packing a group of rows at a
//! time on the fly: a window left in the file's map), and on x86 the k-quants `Q4_K`,
//! `Q5_K`, `Q6_K` and `IQ4_XS` too (whose row-major kernels stay for mapped windows). The
//! other types stay row-major; their SIMD kernels read that directly.
//!
//! Each activation row carries how llama.cpp would batch it ([`RowForm`]): the rows of a
//! product that are tiled (`Q5_K`, `Q6_K`, `IQ4_XS` in llama.cpp's micro-batches of eight
//! rows or more) run as products of their own, on the x86 packed tiles or, on other paths,
//! through [`tiled_rows`].

#[cfg(target_arch = "aarch64")]
mod neon_fam32;
#[cfg(target_arch = "aarch64")]
mod neon_rowmajor;
pub mod pack;
pub mod tiling;
mod tiled_rows;
#[cfg(target_arch = "x86_64")]
mod x86_fam32;
#[cfg(target_arch = "x86_64")]
mod x86_float;
#[cfg(target_arch = "x86_64")]
mod x86_kpacked;
#[cfg(target_arch = "x86_64")]
mod x86_kquant;

use std::ops::Range;

use blink_gguf::GgmlType;

use crate::cpu::Isa;
use crate::order::DotOrder;
use crate::quant::{self, DotAcc, WeightType};
use pack::{Fields, SuperFields, GROUP};

/// How a weight matrix is laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// As in the GGUF file: each row's blocks in order.
    RowMajor,
    /// Groups of eight rows interleaved per block ([`pack`]).
    Packed,
}

/// A weight matrix as the kernels read it: `rows` rows of `cols` elements of `ty`, whose
/// bytes are laid out in `layout`.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    pub ty: GgmlType,
    pub layout: Layout,
    pub rows: usize,
    pub cols: usize,
    pub bytes: &'a [u8],
}

impl MatRef<'_> {
    /// The format of the activation rows this matrix multiplies (its type's
    /// [`WeightType::activation_type`]).
    #[inline]
    pub fn activation_type(&self) -> GgmlType {
        self.ty.activation_type()
    }

    /// Bytes of one activation row this matrix multiplies (`cols` elements of
    /// [`Self::activation_type`]), or `None` if `cols` is not a whole number of its blocks.
    #[inline]
    pub fn activation_row_bytes(&self) -> Option<usize> {
        self.activation_type().row_bytes(self.cols as u64).map(|b| b as usize)
    }
}

/// How llama.cpp would multiply one activation row, which decides its float steps in the
/// llama order (other orders ignore it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RowForm {
    /// In a group of four rows (only `Q4_K` weights tell: [`quant::vec_dot_grouped`]).
    pub grouped: bool,
    /// In a product of eight rows or more, which takes llama.cpp's tiled kernels for the
    /// types of [`quant::takes_tiled`] ([`quant::vec_dot_tiled`]).
    pub tiled: bool,
}

/// Activation rows a product reads: `count` rows of format `ty`, the first at the start of
/// `bytes` and each `stride` bytes after the last (a stride may exceed a row's bytes).
#[derive(Clone, Copy)]
pub struct ActRows<'a> {
    pub ty: GgmlType,
    pub bytes: &'a [u8],
    pub stride: usize,
    pub count: usize,
    /// Per row, how llama.cpp would multiply it; empty (or short): alone.
    pub forms: &'a [RowForm],
}

impl<'a> ActRows<'a> {
    /// How row `r` is multiplied.
    #[inline]
    pub fn form(&self, r: usize) -> RowForm {
        self.forms.get(r).copied().unwrap_or_default()
    }

    /// Rows `range` of these.
    fn slice(&self, range: Range<usize>) -> ActRows<'a> {
        let forms = &self.forms[range.start.min(self.forms.len())..range.end.min(self.forms.len())];
        ActRows { bytes: &self.bytes[range.start * self.stride..], count: range.len(), forms, ..*self }
    }

    /// The runs of consecutive rows that are all tiled or all not, in order.
    fn tiled_runs(&self) -> impl Iterator<Item = (Range<usize>, bool)> + '_ {
        let mut start = 0;
        std::iter::from_fn(move || {
            (start < self.count).then(|| {
                let tiled = self.form(start).tiled;
                let end = (start + 1..self.count).find(|&r| self.form(r).tiled != tiled).unwrap_or(self.count);
                let run = start..end;
                start = end;
                (run, tiled)
            })
        })
    }
}

/// Where results go: element `(r, i)` is `ptr[r * ld + i]`, written or added.
#[derive(Clone, Copy)]
pub struct Out {
    pub ptr: *mut f32,
    pub ld: usize,
    pub accumulate: bool,
}

/// Write (or add) the first `live` of a tile row's `vals` at `o`: the edge of a matrix
/// whose row count is not a multiple of the tile's.
///
/// # Safety
/// `o` must be valid for `live` reads and writes.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
#[inline]
pub(crate) unsafe fn store_live(o: *mut f32, vals: &[f32], live: usize, accumulate: bool) {
    for (i, &x) in vals.iter().enumerate().take(live) {
        if accumulate {
            *o.add(i) += x;
        } else {
            *o.add(i) = x;
        }
    }
}

/// Whether `isa`'s kernels read `ty` from the interleaved layout of [`pack`]: the
/// 32-element formats on every SIMD path, the super-block formats of [`SuperFields`] on
/// x86.
pub fn packs(isa: Isa, ty: GgmlType) -> bool {
    match isa {
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni => Fields::of(ty).is_some() || SuperFields::of(ty).is_some(),
        Isa::Neon | Isa::NeonI8mm => Fields::of(ty).is_some(),
        Isa::Scalar => false,
    }
}

/// The layout `isa`'s kernels want for `ty`, and the repacked bytes if that is not the
/// file's row-major layout.
pub fn prepare(isa: Isa, ty: GgmlType, rows: usize, cols: usize, src: &[u8]) -> Option<Vec<u8>> {
    packs(isa, ty).then(|| pack::pack(ty, rows, cols, src)).flatten()
}

/// Whether `isa`'s kernels run `ty` from the file's row-major layout without a repacked
/// copy (at a cost, for the 32-element formats, of packing each group on the fly): a
/// window that is streamed is then left in the file's map.
pub fn reads_row_major(isa: Isa, ty: GgmlType) -> bool {
    match isa {
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni | Isa::Scalar => true,
        Isa::Neon | Isa::NeonI8mm => !packs(isa, ty),
    }
}

/// Bytes of the layout `isa`'s kernels want for `ty`, when that is not row-major.
pub fn prepared_len(isa: Isa, ty: GgmlType, rows: usize, cols: usize) -> Option<usize> {
    packs(isa, ty).then(|| pack::packed_len(ty, rows, cols)).flatten()
}

/// [`prepare`] into `out` ([`prepared_len`] bytes), for a layout that is refilled in
/// place (a streamed window of a ring); `false` when `ty` stays row-major.
pub fn prepare_into(isa: Isa, ty: GgmlType, rows: usize, cols: usize, src: &[u8], out: &mut [u8]) -> bool {
    packs(isa, ty) && pack::pack_into(ty, rows, cols, src, out)
}

/// Rows a thread's share of a matrix must be aligned to (packed groups never split).
pub const ROW_ALIGN: usize = GROUP;

/// `out[r][i] (+)= w_i · a_r` for activation rows `r` in `0..act.count` and weight rows
/// `i` in each range `rows` yields, as a thread claims them (the caller's work sharing
/// hands them out one by one); what a call does once, such as converting the
/// activations' scales, is done once for all of them. `act` must be in the matrix's
/// [`MatRef::activation_type`] (checked), each row `cols` elements long. With a packed
/// layout, every range must start on a multiple of [`ROW_ALIGN`]. The 32-element formats
/// apply their block scales in `order`; other types have one order.
///
/// # Safety
/// `out.ptr` must be valid for writes at every `(r, i)` above, and no other thread may
/// touch those elements during the call.
pub unsafe fn product(isa: Isa, order: DotOrder, w: &MatRef, act: &ActRows, rows: impl IntoIterator<Item = Range<usize>>, out: Out) {
    assert_eq!(act.ty, w.activation_type(), "{} weights multiply {} activations", w.ty, w.activation_type());
    if act.count == 0 {
        return;
    }
    let rows = rows.into_iter().filter(|r| !r.is_empty());
    if order == DotOrder::Llama && quant::takes_tiled(w.ty) && act.forms.iter().any(|f| f.tiled) {
        // A tiled row's float steps are not a lone row's: each run of rows alike is a
        // product of its own.
        for r in rows {
            for (run, tiled) in act.tiled_runs() {
                product_rows(isa, order, w, &act.slice(run.clone()), tiled, std::iter::once(r.clone()), Out { ptr: out.ptr.add(run.start * out.ld), ..out });
            }
        }
        return;
    }
    product_rows(isa, order, w, act, false, rows, out);
}

/// [`product`] of activation rows that are all `tiled` or all not.
unsafe fn product_rows(isa: Isa, order: DotOrder, w: &MatRef, act: &ActRows, tiled: bool, rows: impl Iterator<Item = Range<usize>>, out: Out) {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut rows = rows;
    let flavour = crate::flavour::active();
    #[cfg(target_arch = "x86_64")]
    {
        let (ty, layout, cols, bytes, a, stride, count) = (w.ty, w.layout, w.cols, w.bytes, act.bytes, act.stride, act.count);
        let done = match isa {
            Isa::Avx512Vnni => x86_fam32::gemm_vnni(order, ty, layout, cols, bytes, &mut rows, a, stride, count, out),
            Isa::Avx2 => x86_fam32::gemm_avx2(order, ty, layout, cols, bytes, &mut rows, a, stride, count, out),
            Isa::AvxVnni => x86_fam32::gemm_avx_vnni(order, ty, layout, cols, bytes, &mut rows, a, stride, count, out),
            _ => false,
        };
        // SAFETY: as for the row-major kernels below.
        let tiled = tiled.then_some(flavour);
        let done = done
            || layout == Layout::Packed
                && match isa {
                    Isa::Avx512Vnni => x86_kpacked::gemm_vnni(ty, cols, bytes, &mut rows, a, stride, count, act.forms, tiled, out),
                    Isa::Avx2 => x86_kpacked::gemm_avx2(ty, cols, bytes, &mut rows, a, stride, count, act.forms, tiled, out),
                    Isa::AvxVnni => x86_kpacked::gemm_avx_vnni(ty, cols, bytes, &mut rows, a, stride, count, act.forms, tiled, out),
                    _ => false,
                };
        if done {
            return;
        }
    }
    for r in rows {
        if tiled {
            tiled_rows::product(flavour, w, act, r, out);
        } else {
            product_range(isa, order, w, act, r, out);
        }
    }
}

/// [`product`] of one nonempty range on the kernels that take one range at a time.
unsafe fn product_range(isa: Isa, order: DotOrder, m: &MatRef, a: &ActRows, rows: Range<usize>, out: Out) {
    let MatRef { ty, layout, cols, bytes: w, .. } = *m;
    let ActRows { bytes: act, stride: act_stride, count: n_act, .. } = *a;
    if layout == Layout::Packed {
        // SAFETY: the NEON paths are only used once `Isa::supported()` holds, which checks
        // the NEON and dot-product features the kernel enables (and the int8 matrix
        // multiply for `NeonI8mm`, the only one that runs `smmla`).
        #[cfg(target_arch = "aarch64")]
        if isa.is_arm() && neon_fam32::gemm_neon(isa == Isa::NeonI8mm, order, ty, cols, w, rows.clone(), act, act_stride, n_act, out) {
            return;
        }
        return scalar_packed(order, m, a, rows, out);
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: an `Isa` other than `Scalar` is only used once `Isa::supported()` holds,
        // which checks every feature these `#[target_feature]` functions enable.
        let done = match isa {
            Isa::Avx512Vnni => {
                x86_kquant::gemm_vnni(ty, cols, w, rows.clone(), act, act_stride, n_act, a.forms, out)
                    || x86_float::gemm_vnni(ty, cols, w, rows.clone(), act, act_stride, n_act, out)
            }
            Isa::Avx2 => {
                x86_kquant::gemm_avx2(ty, cols, w, rows.clone(), act, act_stride, n_act, a.forms, out)
                    || x86_float::gemm_avx2(ty, cols, w, rows.clone(), act, act_stride, n_act, out)
            }
            Isa::AvxVnni => {
                x86_kquant::gemm_avx_vnni(ty, cols, w, rows.clone(), act, act_stride, n_act, a.forms, out)
                    || x86_float::gemm_avx2(ty, cols, w, rows.clone(), act, act_stride, n_act, out)
            }
            _ => false,
        };
        if done {
            return;
        }
    }
    // SAFETY: as for the packed NEON kernel above.
    #[cfg(target_arch = "aarch64")]
    if isa.is_arm() && neon_rowmajor::gemm_neon(ty, cols, w, rows.clone(), act, act_stride, n_act, a.forms, out) {
        return;
    }
    scalar(order, m, a, rows, out);
}

#[inline]
unsafe fn store(out: Out, r: usize, i: usize, v: f32) {
    let o = out.ptr.add(r * out.ld + i);
    if out.accumulate {
        *o += v;
    } else {
        *o = v;
    }
}

/// The reference over row-major weights: one `vec_dot_in` per output.
unsafe fn scalar(order: DotOrder, m: &MatRef, a: &ActRows, rows: Range<usize>, out: Out) {
    let MatRef { ty, cols, bytes: w, .. } = *m;
    let ActRows { bytes: act, stride: act_stride, count: n_act, .. } = *a;
    let rb = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
    let ab = m.activation_row_bytes().expect("whole blocks");
    for i in rows {
        let wrow = &w[i * rb..(i + 1) * rb];
        for r in 0..n_act {
            let arow = &act[r * act_stride..r * act_stride + ab];
            let v = if a.form(r).grouped { quant::vec_dot_grouped(order, ty, cols, wrow, arow) } else { quant::vec_dot_in(order, ty, cols, wrow, arow) };
            store(out, r, i, v);
        }
    }
}

/// The reference over packed weights: each block is put back together, then accumulated
/// exactly as `vec_dot_in` does (a super-block format's whole row, then its `vec_dot`).
unsafe fn scalar_packed(order: DotOrder, m: &MatRef, a: &ActRows, rows: Range<usize>, out: Out) {
    let MatRef { ty, cols, bytes: w, .. } = *m;
    let ActRows { ty: act_ty, bytes: act, stride: act_stride, count: n_act, .. } = *a;
    if SuperFields::of(ty).is_some() {
        let mut row = vec![0u8; ty.row_bytes(cols as u64).expect("whole blocks") as usize];
        for i in rows {
            pack::unpack_row(ty, cols, w, i, &mut row);
            scalar(order, &MatRef { layout: Layout::RowMajor, rows: 1, bytes: &row, ..*m }, a, 0..1, Out { ptr: out.ptr.add(i), ..out });
        }
        return;
    }
    let f = Fields::of(ty).expect("packed layout of a packable type");
    let n_blocks = cols / 32;
    let group_block = f.group_block();
    let mut block = [0u8; 34];
    for i in rows {
        let (g, k) = (i / GROUP, i % GROUP);
        for r in 0..n_act {
            let mut acc = DotAcc::new(order);
            for b in 0..n_blocks {
                pack::unpack_block(&f, &w[(g * n_blocks + b) * group_block..][..group_block], k, &mut block);
                let a = &act[r * act_stride + b * act_ty.type_size()..][..act_ty.type_size()];
                quant::accumulate_block(ty, &block[..f.block], a, &mut acc);
            }
            store(out, r, i, acc.finish());
        }
    }
}

/// Whether `ty` has one dot order, the block order: llama.cpp's repacked kernel for it
/// sums each block in integers first.
pub(crate) const fn block_order_only(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::MXFP4)
}

/// Bytes of one activation row of `cols` columns in a batch's `ty` product on `isa` in
/// `order`, as its panels count them ([`tiling`]): a row of the activation format, or its
/// quants widened to 16 bits where the int16 route takes batches (of 12 rows and more;
/// panels only matter for many more). None if `cols` cannot be a row of the activation
/// format.
pub fn batch_act_row_bytes(isa: Isa, order: DotOrder, ty: GgmlType, cols: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if x86_fam32::takes_int16_route(isa, ty) {
        return cols.is_multiple_of(32).then_some(2 * cols);
    }
    let _ = (isa, order);
    ty.activation_type().row_bytes(cols as u64).map(|b| b as usize)
}

/// How `isa`'s kernels multiply a `ty` matrix in `order`, in words (for `blink info`).
pub fn route(isa: Isa, order: DotOrder, ty: GgmlType) -> String {
    use GgmlType::*;
    if isa == Isa::Scalar {
        return "scalar reference".into();
    }
    let block_order = order == DotOrder::Block || block_order_only(ty);
    let ints = match isa {
        Isa::Avx512Vnni => "vpdpbusd",
        Isa::AvxVnni => "vpdpbusd (AVX-VNNI)",
        Isa::Avx2 => "vpmaddubsw + vpmaddwd",
        Isa::NeonI8mm if block_order => "smmla on pairs of activation rows (sdot for an odd last one)",
        _ => "sdot",
    };
    match ty {
        F32 | F16 | BF16 => "row-major, f32 FMA in ggml's order".into(),
        _ if Fields::of(ty).is_some() => {
            let layout = if isa.is_arm() { "repacked 8-row groups" } else { "8-row groups (repacked, or packed on the fly from a mapped window)" };
            #[cfg(target_arch = "x86_64")]
            let batches = match (x86_fam32::takes_int8_route(isa, order, ty), x86_fam32::takes_int16_route(isa, ty)) {
                (true, _) => format!("; batches of {}+ rows: each group converted to int8 once", x86_fam32::INT8_MIN_ROWS),
                (_, true) => format!("; batches of {}+ rows: each group and row widened to 16 bits once (per panel), vpmaddwd", x86_fam32::WORDS_MIN_ROWS),
                _ => String::new(),
            };
            #[cfg(not(target_arch = "x86_64"))]
            let batches = String::new();
            let order = match ty {
                _ if block_order_only(ty) => "block order (llama.cpp's repacked kernel)",
                _ if order == DotOrder::Llama => "llama.cpp's lane order",
                _ => "block order",
            };
            format!("{layout}, {ints}, {order}{batches}")
        }
        _ if packs(isa, ty) => {
            let ints = match isa {
                Isa::Avx512Vnni => "vpmaddubsw + vpdpwssd",
                Isa::AvxVnni => "vpmaddubsw + vpdpwssd (AVX-VNNI)",
                _ => "vpmaddubsw + vpmaddwd",
            };
            let sums = match ty {
                Q4_K => "a group's 16-bit sums scaled once, two FMA chains (llama.cpp's repacked order)",
                Q5_K => "16-bit sums of four lanes scaled at once, block values summed",
                _ => "eight float lanes",
            };
            format!("8-row groups (repacked; row-major super-blocks from a mapped window), {ints}, {sums}")
        }
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S => {
            let batch = if isa.is_arm() { "" } else { "; batches of 8+ rows decode each block once" };
            format!("row-major lattice runs, {}, eight float lanes{batch}", if isa.is_arm() { "sdot" } else { "vpmaddubsw + signed activations" })
        }
        _ => {
            let sums = match ty {
                Q4_K => "two FMA chains (llama.cpp's repacked order)",
                Q6_K | IQ4_XS | TQ1_0 | TQ2_0 => "eight float lanes",
                _ => "block values summed",
            };
            let ints = match isa {
                Isa::Avx512Vnni => "vpmaddubsw + vpdpwssd",
                Isa::AvxVnni => "vpmaddubsw + vpdpwssd (AVX-VNNI)",
                Isa::Avx2 => "vpmaddubsw + vpmaddwd",
                _ => "sdot",
            };
            format!("row-major super-blocks, {ints}, {sums}")
        }
    }
}
