//! One part's tensors, located, shape-checked and placed once at load time.
//!
//! A flat model is one part holding everything: matrices stay in the file's memory map
//! unless the kernels want them repacked. A tensor-parallel model has one part per NUMA
//! node, holding that node's rows (see `parallel::tensor`) copied into memory bound to the node,
//! so the forward pass never reads another node's memory. Every shape and type the
//! forward pass relies on is checked here, so the forward pass itself never has to.

use std::collections::HashSet;
use std::ops::{Deref, Range};
use std::sync::{Arc, Mutex};

use blink_gguf::{GgmlType, GgufFile, TensorInfo};
use blink_kernels::cpu::Isa;
use blink_kernels::gemm::{self, Layout, MatRef};
use blink_kernels::quant::{self, WeightType};
use blink_runtime::arena::{Arena, Piece};
use blink_runtime::numa::{NodeBuffer, Topology};

use crate::config::{Arch, ModelConfig, QkNorm};
use crate::parallel::tensor::TensorPart;
use crate::ModelError;

/// Borrowed bytes kept alive by an owner (the memory-mapped file, or an owned buffer).
#[derive(Clone)]
pub struct Blob {
    ptr: *const u8,
    len: usize,
    _owner: Arc<dyn Send + Sync>,
}

// SAFETY: a Blob is an immutable view whose owner lives at least as long as it does.
unsafe impl Send for Blob {}
unsafe impl Sync for Blob {}

impl Blob {
    fn mapped(bytes: &[u8], file: &Arc<GgufFile>) -> Blob {
        Blob { ptr: bytes.as_ptr(), len: bytes.len(), _owner: file.clone() }
    }

    fn piece(p: Piece) -> Blob {
        // SAFETY: the piece lies inside its chunk, which the Blob keeps alive.
        let ptr = unsafe { p.chunk.as_ptr().add(p.at) };
        Blob { ptr, len: p.len, _owner: p.chunk }
    }

    #[inline]
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr/len describe memory owned by `_owner`, which this Blob keeps alive,
        // and nobody mutates it.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// A weight matrix: `rows` output features, each a row of `cols` input features of type
/// `ty`, stored row-major as in the file or repacked for the active kernels.
#[derive(Clone)]
pub struct Matrix {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub layout: Layout,
    /// The rows of the file's tensor `name` this matrix holds (a part's rows, or one
    /// matrix of a fused tensor).
    pub file_rows: Range<usize>,
    data: Blob,
    refillable: bool,
}

impl Matrix {
    /// The matrix bytes, in `layout`.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// The matrix as the kernels take it.
    #[inline]
    pub fn mat_ref(&self) -> MatRef<'_> {
        MatRef { ty: self.ty, layout: self.layout, rows: self.rows, cols: self.cols, bytes: self.bytes() }
    }

    /// The file's row-major bytes of this matrix's rows.
    pub fn source<'f>(&self, file: &'f GgufFile) -> &'f [u8] {
        let info = file.tensor(&self.name).expect("a matrix of the model's own file");
        let data = file.tensor_data(info);
        let row = self.ty.row_bytes(self.cols as u64).expect("checked at load") as usize;
        &data[self.file_rows.start * row..self.file_rows.end * row]
    }

    /// Whether the matrix is a copy its process refills from the file ([`Matrix::refill`]):
    /// a streamed window's repacked matrix.
    pub fn refillable(&self) -> bool {
        self.refillable
    }

    /// Fill a refillable matrix from `src`, its tensor's row-major bytes in the file.
    ///
    /// # Safety
    /// No step may run on the model meanwhile (nothing may read the matrix).
    pub unsafe fn refill(&self, src: &[u8]) {
        assert!(self.refillable, "{} is not a refillable matrix", self.name);
        // SAFETY: the caller keeps every reader away; the bytes are this matrix's own
        // piece of an arena chunk, reserved for it and written only here.
        let out = unsafe { std::slice::from_raw_parts_mut(self.data.ptr as *mut u8, self.data.len) };
        let filled = gemm::prepare_into(blink_kernels::cpu::active(), self.ty, self.rows, self.cols, src, out);
        assert!(filled, "{} was reserved for a packed layout", self.name);
    }

    /// Give a refillable matrix's memory back; it must be refilled before it is used.
    ///
    /// # Safety
    /// As [`Matrix::refill`]; and no other refillable matrix that is in use may share a
    /// page with this one (a window's matrices are refilled together, after any other's
    /// release).
    pub unsafe fn forget(&self) {
        if self.refillable {
            // SAFETY: as the caller promises.
            let _ = unsafe { blink_runtime::residency::discard(self.bytes()) };
        }
    }

    /// Row `i` dequantized into `out[..cols]` (row-major matrices only).
    pub fn dequantize_row(&self, i: usize, out: &mut [f32]) {
        assert_eq!(self.layout, Layout::RowMajor, "dequantize_row needs a row-major matrix");
        let rb = self.bytes().len() / self.rows.max(1);
        quant::dequantize_row(self.ty, &self.bytes()[i * rb..(i + 1) * rb], &mut out[..self.cols]);
    }
}

/// A vector of f32 (norm weights, biases) in the part's memory.
pub enum Vector {
    Heap(Vec<f32>),
    Node(NodeBuffer<f32>),
}

impl Deref for Vector {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            Vector::Heap(v) => v,
            Vector::Node(b) => b,
        }
    }
}

/// Weights of one transformer block, restricted to one part's rows.
pub struct LayerWeights {
    /// RMS norm weights of the block inputs (none in OLMo 2).
    pub attn_norm: Option<Vector>,
    /// Rows of the part's query heads.
    pub wq: Matrix,
    /// Rows of the part's key/value heads.
    pub wk: Matrix,
    pub wv: Matrix,
    /// The part's rows of the output projection (all columns).
    pub wo: Matrix,
    /// Q/K/V biases (Qwen2), for the part's heads.
    pub bq: Option<Vector>,
    pub bk: Option<Vector>,
    pub bv: Option<Vector>,
    /// RMS norms of Q and K, per head (Qwen3, Gemma 3) or whole (OLMo 2: all the
    /// columns, whatever the part).
    pub q_norm: Option<Vector>,
    pub k_norm: Option<Vector>,
    /// RMS norms of the attention and FFN outputs (Gemma, OLMo 2).
    pub attn_post_norm: Option<Vector>,
    pub ffn_post_norm: Option<Vector>,
    pub ffn_norm: Option<Vector>,
    pub ffn: Ffn,
}

/// A layer's FFN: one, or a mixture of experts.
pub enum Ffn {
    Dense(FfnMatrices),
    Experts(Experts),
}

/// One SwiGLU FFN's matrices, restricted to a part's rows.
pub struct FfnMatrices {
    /// The part's FFN rows.
    pub gate: Matrix,
    pub up: Matrix,
    /// The part's rows of the down projection (all columns).
    pub down: Matrix,
}

/// A mixture of experts: the router (every expert's row, in every part) and the FFNs of
/// the part's own experts (`TensorPart::experts`, in order), whole.
pub struct Experts {
    pub router: Matrix,
    pub experts: Vec<FfnMatrices>,
}

impl LayerWeights {
    /// The dense FFN; a layer of experts panics (callers that take dense models only).
    pub fn dense(&self) -> &FfnMatrices {
        match &self.ffn {
            Ffn::Dense(f) => f,
            Ffn::Experts(_) => panic!("a layer of experts where a dense FFN was expected"),
        }
    }

    /// Every matrix of the layer a step multiplies (with experts: all of them).
    pub fn matrices(&self) -> impl Iterator<Item = &Matrix> {
        let ffn: Vec<&Matrix> = match &self.ffn {
            Ffn::Dense(f) => vec![&f.gate, &f.up, &f.down],
            Ffn::Experts(e) => std::iter::once(&e.router).chain(e.experts.iter().flat_map(|f| [&f.gate, &f.up, &f.down])).collect(),
        };
        [&self.wq, &self.wk, &self.wv, &self.wo].into_iter().chain(ffn)
    }
}

/// One part's weights.
pub struct Weights {
    /// The part's vocabulary rows of the embedding table, row-major.
    pub token_embd: Matrix,
    pub output_norm: Vector,
    /// The part's vocabulary rows of the LM head.
    pub output: Matrix,
    /// Per model layer, its weights if this process holds it (a ring device holds only
    /// its windows; see [`Share`]).
    pub layers: Vec<Option<LayerWeights>>,
}

/// Which of a file's tensors a process loads (every layer, or a ring device's windows of
/// layers) and how it holds the matrices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Share {
    /// The layer windows held; `None` holds every layer.
    pub windows: Option<Vec<Range<usize>>>,
    pub matrices: Matrices,
}

/// How a process holds its layers' matrices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Matrices {
    /// Repacked for the kernels where they want it, else in the file's map.
    #[default]
    Repacked,
    /// All in the file's map, row-major: no copy (slower products).
    Mapped,
    /// Streamed: in the file's map where the kernels read the file's layout (on x86,
    /// every type), else as [`Matrices::Refilled`].
    Streamed,
    /// Streamed as repacked copies wherever the kernels repack: room reserved but not
    /// filled, which the process refills from the file before each use and gives back
    /// after (the others in the file's map).
    Refilled,
}

impl Matrices {
    /// Whether the matrices are held only around their use (streamed or refilled).
    pub fn streamed(self) -> bool {
        matches!(self, Matrices::Streamed | Matrices::Refilled)
    }
}

impl Share {
    /// Every layer, as the kernels like it.
    pub fn all() -> Share {
        Share::default()
    }

    /// Only `windows` of layers, their matrices held as `matrices` says.
    pub fn windows(windows: Vec<Range<usize>>, matrices: Matrices) -> Share {
        Share { windows: Some(windows), matrices }
    }

    /// Whether model layer `layer` is held.
    pub fn holds(&self, layer: usize) -> bool {
        self.windows.as_ref().is_none_or(|w| w.iter().any(|r| r.contains(&layer)))
    }
}

/// Where a part's copies go.
#[derive(Clone, Copy)]
pub enum Home<'a> {
    /// The process heap, or the file's map when no copy is needed (flat models).
    Shared,
    /// Memory bound to node `node` of `topology` (tensor-parallel parts).
    Node { topology: &'a Topology, node: usize },
}

/// Looks tensors up by name, checks them and places one part's share.
pub(crate) struct Loader<'a> {
    file: &'a Arc<GgufFile>,
    isa: Isa,
    home: Home<'a>,
    arena: Arena<'a>,
    used: &'a Used,
    matrices: Matrices,
}

/// The names of the tensors the loaders read, so that a tensor none of them reads (a bias
/// or a feature this engine lacks) is refused rather than silently left out.
#[derive(Default)]
pub(crate) struct Used(Mutex<HashSet<String>>);

impl Used {
    /// Refuse `file` if it holds a tensor no loader read (llama.cpp refuses such a file too).
    /// Tensors of layers the process does not hold are left to the process that does.
    pub(crate) fn check_all(&self, file: &GgufFile, share: &Share) -> Result<(), ModelError> {
        let used = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let held = |name: &str| layer_of(name).is_none_or(|l| share.holds(l));
        match file.tensors().iter().find(|t| held(&t.name) && !used.contains(&t.name)) {
            Some(t) => Err(ModelError::Unsupported(format!("tensor '{}', which this engine does not use (a feature of the model it lacks)", t.name))),
            None => Ok(()),
        }
    }
}

impl<'a> Loader<'a> {
    pub(crate) fn new(file: &'a Arc<GgufFile>, isa: Isa, home: Home<'a>, used: &'a Used, matrices: Matrices) -> Loader<'a> {
        let node = match home {
            Home::Shared => None,
            Home::Node { topology, node } => Some((topology, node)),
        };
        // Streamed copies are given back and refilled window by window: no huge pages.
        let arena = if matrices.streamed() { Arena::small_pages(node) } else { Arena::new(node) };
        Loader { file, isa, home, arena, used, matrices }
    }

    fn info(&self, name: &str) -> Result<&TensorInfo, ModelError> {
        let info = self.file.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        self.used.0.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string());
        Ok(info)
    }

    /// Check that `name` is a matrix with `cols` inputs and `rows` outputs (GGUF dims
    /// `[cols, rows]`) that the kernels can multiply.
    fn check_matrix(&self, name: &str, cols: usize, rows: usize) -> Result<&TensorInfo, ModelError> {
        let info = self.info(name)?;
        let ok = match info.dims.as_slice() {
            [c, r] => *c == cols as u64 && *r == rows as u64,
            [c, r, rest @ ..] => *c == cols as u64 && *r == rows as u64 && rest.iter().all(|&d| d == 1),
            _ => false,
        };
        if !ok {
            return Err(ModelError::BadTensor(format!("{name} has shape {:?}, expected [{cols}, {rows}]", info.dims)));
        }
        Ok(info)
    }

    /// A copy of `bytes` in the part's home (the heap or the node's memory), in huge-page
    /// backed chunks ([`blink_runtime::arena`]).
    fn place(&self, bytes: &[u8]) -> Result<Blob, ModelError> {
        self.arena.place(bytes).map(Blob::piece).map_err(|e| ModelError::Placement(e.to_string()))
    }

    /// `n` rows of `cols` of `ty` (the file's bytes `src`) repacked straight into a piece of
    /// `len` bytes of the arena. The file's pages of them are given back to the kernel
    /// (they are not read again, and refault from the file if they are): the repacked copy
    /// never sits beside a resident copy of the same bytes, so a model's resident memory
    /// is about its file's size, as llama.cpp's. The page cache keeps them.
    fn repack(&self, ty: GgmlType, n: usize, cols: usize, src: &[u8], len: usize) -> Result<Blob, ModelError> {
        let blob = Blob::piece(self.arena.reserve(len).map_err(|e| ModelError::Placement(e.to_string()))?);
        // SAFETY: a fresh piece of an arena chunk, reserved for this matrix and read by
        // nothing yet.
        let out = unsafe { std::slice::from_raw_parts_mut(blob.ptr as *mut u8, blob.len) };
        let filled = gemm::prepare_into(self.isa, ty, n, cols, src, out);
        debug_assert!(filled, "prepared_len said {ty} is packed");
        if self.file.is_mapped() {
            // SAFETY: `src` lies in the file's read-only map; its pages refault from the
            // file whenever something reads them (a tied embedding's lookups).
            let _ = unsafe { blink_runtime::residency::release(src, None) };
        }
        Ok(blob)
    }

    /// Rows `range` of a matrix with `rows` rows of `cols` inputs, in the layout the kernels
    /// want when `for_products`, else row-major (embedding lookups).
    fn rows(&self, name: &str, cols: usize, rows: usize, range: Range<usize>, for_products: bool) -> Result<Matrix, ModelError> {
        self.rows_as(name, cols, rows, range, for_products, self.matrices)
    }

    /// [`Loader::rows`], held as `matrices` says.
    fn rows_as(&self, name: &str, cols: usize, rows: usize, range: Range<usize>, for_products: bool, matrices: Matrices) -> Result<Matrix, ModelError> {
        self.check_matrix(name, cols, rows)?;
        self.rows_as_flat(name, cols, rows, range, for_products, matrices)
    }

    /// [`Loader::rows_as`] of a tensor already checked to hold `rows` rows of `cols`.
    fn rows_as_flat(&self, name: &str, cols: usize, rows: usize, range: Range<usize>, for_products: bool, matrices: Matrices) -> Result<Matrix, ModelError> {
        let info = self.info(name)?;
        let act = info.ty.activation_type();
        if !cols.is_multiple_of(act.block_size()) {
            return Err(ModelError::Unsupported(format!("{name}: type {} needs rows of a multiple of {} elements, but rows have {cols}", info.ty, act.block_size())));
        }
        let data = self.file.tensor_data(info);
        let rb = data.len() / rows.max(1);
        let slice = &data[range.start * rb..range.end * rb];
        let n = range.len();
        let refilled = matrices == Matrices::Refilled || (matrices == Matrices::Streamed && !gemm::reads_row_major(self.isa, info.ty));
        if for_products && refilled {
            if let Some(len) = gemm::prepared_len(self.isa, info.ty, n, cols) {
                let piece = self.arena.reserve(len).map_err(|e| ModelError::Placement(e.to_string()))?;
                return Ok(Matrix { name: name.to_string(), ty: info.ty, rows: n, cols, layout: Layout::Packed, file_rows: range, data: Blob::piece(piece), refillable: true });
            }
        }
        let packed_len = if for_products && matrices == Matrices::Repacked { gemm::prepared_len(self.isa, info.ty, n, cols) } else { None };
        let (layout, blob) = match (packed_len, self.home) {
            (Some(len), _) => (Layout::Packed, self.repack(info.ty, n, cols, slice, len)?),
            (None, Home::Shared) if n == rows => (Layout::RowMajor, Blob::mapped(slice, self.file)),
            (None, _) => (Layout::RowMajor, self.place(slice)?),
        };
        Ok(Matrix { name: name.to_string(), ty: info.ty, rows: n, cols, layout, file_rows: range, data: blob, refillable: false })
    }

    /// Rows `range` of matrix `index` of a stack of `count` matrices of `rows` rows of
    /// `cols` (GGUF dims `[cols, rows, count]`: the experts of a layer).
    fn rows_3d(&self, name: &str, cols: usize, rows: usize, count: usize, index: usize, range: Range<usize>) -> Result<Matrix, ModelError> {
        let info = self.info(name)?;
        if info.dims.as_slice() != [cols as u64, rows as u64, count as u64] {
            return Err(ModelError::BadTensor(format!("{name} has shape {:?}, expected [{cols}, {rows}, {count}]", info.dims)));
        }
        let at = index * rows;
        self.rows_as_flat(name, cols, rows * count, at + range.start..at + range.end, true, self.matrices)
    }

    /// A vector of `len` values converted to f32, restricted to `range`.
    fn vector_range(&self, name: &str, len: usize, range: Range<usize>) -> Result<Vector, ModelError> {
        let info = self.info(name)?;
        if info.n_elements() != len as u64 || info.dims[0] != len as u64 {
            return Err(ModelError::BadTensor(format!("{name} has shape {:?}, expected [{len}]", info.dims)));
        }
        if !matches!(info.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return Err(ModelError::BadTensor(format!("{name} has type {}, expected a float type", info.ty)));
        }
        let mut all = vec![0f32; len];
        quant::dequantize_row(info.ty, self.file.tensor_data(info), &mut all);
        if all.iter().any(|v| !v.is_finite()) {
            return Err(ModelError::BadTensor(format!("{name} holds a non-finite value")));
        }
        let part = &all[range];
        match self.home {
            Home::Shared => Ok(Vector::Heap(part.to_vec())),
            Home::Node { topology, node } => {
                let mut buf = NodeBuffer::<f32>::new(topology, node, part.len()).map_err(|e| ModelError::Placement(e.to_string()))?;
                buf.as_mut_slice().copy_from_slice(part);
                Ok(Vector::Node(buf))
            }
        }
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vector, ModelError> {
        self.vector_range(name, len, 0..len)
    }

    fn opt_vector_range(&self, name: &str, len: usize, range: Range<usize>) -> Result<Option<Vector>, ModelError> {
        match self.file.tensor(name) {
            Some(_) => self.vector_range(name, len, range).map(Some),
            None => Ok(None),
        }
    }

    /// The rope frequency divisors, if the file has them.
    pub(crate) fn rope_freqs(&self, cfg: &ModelConfig) -> Result<Option<Vec<f32>>, ModelError> {
        self.rope_factors(cfg, "rope_freqs.weight")
    }

    /// Per-dimension rope frequency divisors `name`, if the file has them (Llama 3's
    /// `rope_freqs`, Phi-3's `rope_factors_short` and `rope_factors_long`).
    pub(crate) fn rope_factors(&self, cfg: &ModelConfig, name: &str) -> Result<Option<Vec<f32>>, ModelError> {
        let len = cfg.rope.n_dims / 2;
        let factors = self.opt_vector_range(name, len, 0..len)?.map(|v| v.to_vec());
        if factors.as_ref().is_some_and(|f| f.contains(&0.0)) {
            return Err(ModelError::BadTensor(format!("{name} holds a factor of 0")));
        }
        Ok(factors)
    }
}

impl Weights {
    /// Locate, check and place `part`'s share of every tensor `cfg` needs, of the layers
    /// `share` holds.
    pub(crate) fn load(ld: &Loader, cfg: &ModelConfig, part: &TensorPart, share: &Share) -> Result<Weights, ModelError> {
        let (d, q, kv, ff, hd) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff, cfg.head_dim);
        let vocab = cfg.vocab_size;
        let qr = part.q_heads.start * hd..part.q_heads.end * hd;
        let kvr = part.kv_heads.start * hd..part.kv_heads.end * hd;
        let token_embd = ld.rows("token_embd.weight", d, vocab, part.vocab_rows.clone(), false)?;
        // Only layers stream: a process streaming its windows is a ring device that runs
        // no LM head, which stays in the map.
        let head = if ld.matrices.streamed() { Matrices::Mapped } else { ld.matrices };
        let output_name = if ld.file.tensor("output.weight").is_some() { "output.weight" } else { "token_embd.weight" };
        let output = ld.rows_as(output_name, d, vocab, part.vocab_rows.clone(), true, head)?;
        let output_norm = ld.vector("output_norm.weight", d)?;
        let biased = cfg.arch == Arch::Qwen2;
        let layers = (0..cfg.n_layers)
            .map(|i| {
                if !share.holds(i) {
                    return Ok(None);
                }
                let n = |s: &str| format!("blk.{i}.{s}");
                let bias = |s: &str, len, r: &Range<usize>| -> Result<Option<Vector>, ModelError> {
                    if biased {
                        ld.vector_range(&n(s), len, r.clone()).map(Some)
                    } else {
                        ld.opt_vector_range(&n(s), len, r.clone())
                    }
                };
                // Per head: one head's weight; whole: the projection's (each part norms
                // whole rows, shared between the parts).
                let qk_norm = |s: &str, width: usize| -> Result<Option<Vector>, ModelError> {
                    match cfg.qk_norm {
                        Some(QkNorm::PerHead) => ld.vector(&n(s), hd).map(Some),
                        Some(QkNorm::Whole) => ld.vector(&n(s), width).map(Some),
                        None => Ok(None),
                    }
                };
                let when = |wanted: bool, s: &str| -> Result<Option<Vector>, ModelError> {
                    if wanted {
                        ld.vector(&n(s), d).map(Some)
                    } else {
                        Ok(None)
                    }
                };
                // Q, K and V as row ranges of one fused tensor when the file has it (as
                // llama.cpp accepts for any family), else their own tensors.
                let qkv_name = n("attn_qkv.weight");
                let (wq, wk, wv) = if ld.file.tensor(&qkv_name).is_some() {
                    let all = q + 2 * kv;
                    let rows = |at: usize, r: &Range<usize>| ld.rows(&qkv_name, d, all, at + r.start..at + r.end, true);
                    (rows(0, &qr)?, rows(q, &kvr)?, rows(q + kv, &kvr)?)
                } else {
                    (
                        ld.rows(&n("attn_q.weight"), d, q, qr.clone(), true)?,
                        ld.rows(&n("attn_k.weight"), d, kv, kvr.clone(), true)?,
                        ld.rows(&n("attn_v.weight"), d, kv, kvr.clone(), true)?,
                    )
                };
                let ffr = &part.ff_rows;
                let ffn = match cfg.moe {
                    // Experts: 3-D tensors, expert `e` the rows `e·n..(e + 1)·n` of each. A
                    // part holds its own experts whole.
                    Some(moe) => {
                        let whole = |name: &str, cols: usize, rows: usize, e: usize| ld.rows_3d(&n(name), cols, rows, moe.n_expert, e, 0..rows);
                        let experts = part
                            .experts
                            .clone()
                            .map(|e| {
                                Ok(FfnMatrices {
                                    gate: whole("ffn_gate_exps.weight", d, ff, e)?,
                                    up: whole("ffn_up_exps.weight", d, ff, e)?,
                                    down: whole("ffn_down_exps.weight", ff, d, e)?,
                                })
                            })
                            .collect::<Result<Vec<_>, ModelError>>()?;
                        Ffn::Experts(Experts { router: ld.rows(&n("ffn_gate_inp.weight"), d, moe.n_expert, 0..moe.n_expert, true)?, experts })
                    }
                    // Phi-3 fuses the gate (first half) and up (second half) projections.
                    None if cfg.arch == Arch::Phi3 => {
                        let up = n("ffn_up.weight");
                        Ffn::Dense(FfnMatrices {
                            gate: ld.rows(&up, d, 2 * ff, ffr.clone(), true)?,
                            up: ld.rows(&up, d, 2 * ff, ff + ffr.start..ff + ffr.end, true)?,
                            down: ld.rows(&n("ffn_down.weight"), ff, d, part.embd_rows.clone(), true)?,
                        })
                    }
                    None => Ffn::Dense(FfnMatrices {
                        gate: ld.rows(&n("ffn_gate.weight"), d, ff, ffr.clone(), true)?,
                        up: ld.rows(&n("ffn_up.weight"), d, ff, ffr.clone(), true)?,
                        down: ld.rows(&n("ffn_down.weight"), ff, d, part.embd_rows.clone(), true)?,
                    }),
                };
                Ok(Some(LayerWeights {
                    attn_norm: when(cfg.pre_norms, "attn_norm.weight")?,
                    wq,
                    wk,
                    wv,
                    wo: ld.rows(&n("attn_output.weight"), q, d, part.embd_rows.clone(), true)?,
                    bq: bias("attn_q.bias", q, &qr)?,
                    bk: bias("attn_k.bias", kv, &kvr)?,
                    bv: bias("attn_v.bias", kv, &kvr)?,
                    q_norm: qk_norm("attn_q_norm.weight", q)?,
                    k_norm: qk_norm("attn_k_norm.weight", kv)?,
                    attn_post_norm: when(cfg.post_norms, "post_attention_norm.weight")?,
                    ffn_post_norm: when(cfg.post_norms, "post_ffw_norm.weight")?,
                    ffn_norm: when(cfg.pre_norms, "ffn_norm.weight")?,
                    ffn,
                }))
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Weights { token_embd, output_norm, output, layers })
    }

    /// Layer `l`'s weights; the forward pass runs only layers the process holds (checked
    /// before a step runs).
    #[inline]
    pub fn layer(&self, l: usize) -> &LayerWeights {
        self.layers[l].as_ref().expect("a step runs only the layers its process holds")
    }

    /// Whether every layer in `layers` is held.
    pub fn holds(&self, layers: Range<usize>) -> bool {
        layers.into_iter().all(|l| self.layers.get(l).is_some_and(Option::is_some))
    }

    /// The matrices one decode step multiplies over the held layers, with the LM head last.
    pub fn product_matrices(&self) -> impl Iterator<Item = &Matrix> {
        self.layers
            .iter()
            .flatten()
            .flat_map(|l| l.matrices())
            .chain(std::iter::once(&self.output))
    }
}

/// Refuse a file holding tensors of layers past its `block_count`: its metadata and its
/// tensors disagree (llama.cpp refuses such a file too, having used fewer tensors than it
/// holds), and running the first layers alone would give wrong text without a word.
pub(crate) fn check_layer_count(file: &GgufFile, cfg: &ModelConfig) -> Result<(), ModelError> {
    match file.tensors().iter().find(|t| layer_of(&t.name).is_some_and(|l| l >= cfg.n_layers)) {
        Some(t) => Err(ModelError::BadConfig(format!("block_count is {}, but the file holds tensor '{}' of a later layer", cfg.n_layers, t.name))),
        None => Ok(()),
    }
}

/// The layer a tensor named `blk.{layer}.…` belongs to.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse::<usize>().ok()
}

/// Release the file's pages of every matrix all parts hold their own copies of: every
/// matrix when the model is split over nodes, the repacked ones when it is flat.
pub(crate) fn release_copied(file: &GgufFile, parts: &[Weights]) {
    let split = parts.len() > 1;
    let Some(first) = parts.first() else { return };
    for (i, m) in first.product_matrices().enumerate() {
        let copied = split || parts.iter().all(|w| w.product_matrices().nth(i).is_some_and(|m| m.layout == Layout::Packed));
        if let (true, Some(info)) = (copied, file.tensor(&m.name)) {
            file.release_tensor(info);
        }
    }
    if split {
        // Each part copied its rows of the embedding table too.
        if let Some(info) = file.tensor("token_embd.weight") {
            file.release_tensor(info);
        }
    }
}
