//! The model's tensors, located and shape-checked once at load time.
//!
//! Matrices stay where the GGUF file's memory map put them (zero-copy); small vectors
//! (norms, biases) are converted to f32 once. Every shape and type the forward pass relies
//! on is checked here, so the forward pass itself never has to.

use std::sync::Arc;

use blink_gguf::{GgmlType, GgufFile, TensorInfo};
use blink_kernels::cpu::Isa;
use blink_kernels::gemm::{self, Layout};
use blink_kernels::quant;

use crate::config::{Arch, ModelConfig};
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
    fn mapped(file: &Arc<GgufFile>, info: &TensorInfo) -> Blob {
        let bytes = file.tensor_data(info);
        Blob { ptr: bytes.as_ptr(), len: bytes.len(), _owner: file.clone() }
    }

    /// Owned bytes, e.g. a repacked or node-local copy.
    pub fn owned(bytes: Vec<u8>) -> Blob {
        let owner: Arc<Vec<u8>> = Arc::new(bytes);
        Blob { ptr: owner.as_ptr(), len: owner.len(), _owner: owner }
    }

    #[inline]
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr/len describe memory owned by `_owner`, which this Blob keeps alive,
        // and nobody mutates it.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// A weight matrix: `rows` output features, each a row of `cols` input features of type `ty`,
/// stored row-major as in the file or repacked for the active kernels.
#[derive(Clone)]
pub struct Matrix {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub layout: Layout,
    data: Blob,
}

impl Matrix {
    /// The matrix bytes, in `layout`.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// Row `i` dequantized into `out[..cols]` (row-major matrices only).
    pub fn dequantize_row(&self, i: usize, out: &mut [f32]) {
        assert_eq!(self.layout, Layout::RowMajor, "dequantize_row needs a row-major matrix");
        let rb = self.bytes().len() / self.rows;
        quant::dequantize_row(self.ty, &self.bytes()[i * rb..(i + 1) * rb], &mut out[..self.cols]);
    }

    /// A copy prepared for `isa`'s kernels: repacked if they want another layout.
    fn prepared(self, isa: Isa) -> Matrix {
        match gemm::prepare(isa, self.ty, self.rows, self.cols, self.bytes()) {
            Some(packed) => Matrix { layout: Layout::Packed, data: Blob::owned(packed), ..self },
            None => self,
        }
    }
}

/// Weights of one transformer block.
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    /// Q/K/V biases (Qwen2).
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// Per-head RMS norms of Q and K (Qwen3).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
}

/// All weights of a model.
pub struct Weights {
    pub token_embd: Matrix,
    pub output_norm: Vec<f32>,
    /// The LM head; a clone of `token_embd` when the model ties them.
    pub output: Matrix,
    /// Per-dimension rope frequency divisors (Llama 3 style), if the file has them.
    pub rope_freqs: Option<Vec<f32>>,
    pub layers: Vec<LayerWeights>,
}

/// Looks tensors up by name and checks them.
struct Loader<'a> {
    file: &'a Arc<GgufFile>,
    isa: Isa,
}

impl Loader<'_> {
    fn info(&self, name: &str) -> Result<&TensorInfo, ModelError> {
        self.file
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    /// A matrix with `cols` inputs and `rows` outputs (GGUF dims `[cols, rows]`).
    fn matrix(&self, name: &str, cols: usize, rows: usize) -> Result<Matrix, ModelError> {
        let info = self.info(name)?;
        let dims: Vec<u64> = info.dims.clone();
        let ok = match dims.as_slice() {
            [c, r] => *c == cols as u64 && *r == rows as u64,
            [c, r, rest @ ..] => *c == cols as u64 && *r == rows as u64 && rest.iter().all(|&d| d == 1),
            _ => false,
        };
        if !ok {
            return Err(ModelError::BadTensor(format!(
                "{name} has shape {dims:?}, expected [{cols}, {rows}]"
            )));
        }
        let act = quant::vec_dot_type(info.ty);
        if cols % act.block_size() != 0 {
            return Err(ModelError::Unsupported(format!(
                "{name}: type {} needs rows of a multiple of {} elements, but rows have {cols}",
                info.ty,
                act.block_size()
            )));
        }
        Ok(Matrix {
            name: name.to_string(),
            ty: info.ty,
            rows,
            cols,
            layout: Layout::RowMajor,
            data: Blob::mapped(self.file, info),
        })
    }

    /// A matrix used only in products: repacked for the kernels when they want it, after
    /// which the file's pages of it are released.
    fn weight(&self, name: &str, cols: usize, rows: usize) -> Result<Matrix, ModelError> {
        let m = self.matrix(name, cols, rows)?.prepared(self.isa);
        if m.layout != Layout::RowMajor {
            self.file.release_tensor(self.info(name)?);
        }
        Ok(m)
    }

    fn opt_weight(&self, name: &str, cols: usize, rows: usize) -> Result<Option<Matrix>, ModelError> {
        match self.file.tensor(name) {
            Some(_) => self.weight(name, cols, rows).map(Some),
            None => Ok(None),
        }
    }

    /// A vector of `len` values converted to f32.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let info = self.info(name)?;
        if info.n_elements() != len as u64 || info.dims[0] != len as u64 {
            return Err(ModelError::BadTensor(format!(
                "{name} has shape {:?}, expected [{len}]",
                info.dims
            )));
        }
        if !matches!(info.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return Err(ModelError::BadTensor(format!("{name} has type {}, expected a float type", info.ty)));
        }
        let mut out = vec![0f32; len];
        quant::dequantize_row(info.ty, self.file.tensor_data(info), &mut out);
        if out.iter().any(|v| !v.is_finite()) {
            return Err(ModelError::BadTensor(format!("{name} holds a non-finite value")));
        }
        Ok(out)
    }

    fn opt_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, ModelError> {
        match self.file.tensor(name) {
            Some(_) => self.vector(name, len).map(Some),
            None => Ok(None),
        }
    }
}

impl Weights {
    /// Locate and check every tensor `cfg` needs, preparing matrices for `isa`'s kernels.
    pub fn from_gguf(file: &Arc<GgufFile>, cfg: &ModelConfig, isa: Isa) -> Result<Weights, ModelError> {
        let ld = Loader { file, isa };
        let (d, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        // The embedding table is read by rows, so it stays as in the file; a tied output
        // head gets its own prepared copy.
        let token_embd = ld.matrix("token_embd.weight", d, cfg.vocab_size)?;
        let output = match ld.opt_weight("output.weight", d, cfg.vocab_size)? {
            Some(m) => m,
            None => {
                let head = token_embd.clone().prepared(isa);
                if head.layout != Layout::RowMajor {
                    // Packing read the whole table; embedding lookups touch a row at a time.
                    file.release_tensor(ld.info("token_embd.weight")?);
                }
                head
            }
        };
        let output_norm = ld.vector("output_norm.weight", d)?;
        let rope_freqs = ld.opt_vector("rope_freqs.weight", cfg.rope.n_dims / 2)?;

        let layers = (0..cfg.n_layers)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}");
                let biased = cfg.arch == Arch::Qwen2;
                let qk_norm = cfg.arch == Arch::Qwen3;
                let bias = |s: &str, len| -> Result<Option<Vec<f32>>, ModelError> {
                    if biased { ld.vector(&n(s), len).map(Some) } else { ld.opt_vector(&n(s), len) }
                };
                Ok(LayerWeights {
                    attn_norm: ld.vector(&n("attn_norm.weight"), d)?,
                    wq: ld.weight(&n("attn_q.weight"), d, q)?,
                    wk: ld.weight(&n("attn_k.weight"), d, kv)?,
                    wv: ld.weight(&n("attn_v.weight"), d, kv)?,
                    wo: ld.weight(&n("attn_output.weight"), q, d)?,
                    bq: bias("attn_q.bias", q)?,
                    bk: bias("attn_k.bias", kv)?,
                    bv: bias("attn_v.bias", kv)?,
                    q_norm: if qk_norm { Some(ld.vector(&n("attn_q_norm.weight"), cfg.head_dim)?) } else { None },
                    k_norm: if qk_norm { Some(ld.vector(&n("attn_k_norm.weight"), cfg.head_dim)?) } else { None },
                    ffn_norm: ld.vector(&n("ffn_norm.weight"), d)?,
                    w_gate: ld.weight(&n("ffn_gate.weight"), d, ff)?,
                    w_up: ld.weight(&n("ffn_up.weight"), d, ff)?,
                    w_down: ld.weight(&n("ffn_down.weight"), ff, d)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;

        Ok(Weights { token_embd, output_norm, output, rope_freqs, layers })
    }
}
