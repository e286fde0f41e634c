//! Streamed weights: a device whose windows do not fit its memory budget keeps as many
//! of them resident as fit beside room for one more, and holds each of the others only
//! around its use. Where the kernels read the file's layout (on x86, every type) a
//! window is the file's own mapped pages, read ahead before it runs and given back after
//! it, page cache included (`blink_runtime::residency`). Elsewhere the matrices the
//! kernels repack get room reserved at load but no bytes; before a window runs they are
//! refilled from the file (read, repacked, and the file's pages given back at once), and
//! after it has run their memory is given back too (`madvise(MADV_DONTNEED)`). The next
//! streamed window is read while the other devices compute, right after the last one's
//! output has been sent on.

use std::ops::Range;
use std::sync::Arc;

use blink_gguf::GgufFile;
use blink_model::weights::Matrix;
use blink_model::Model;
use blink_runtime::residency;

/// A device's streamed windows.
pub struct Streamer {
    file: Arc<GgufFile>,
    model: Arc<Model>,
    windows: Vec<Range<usize>>,
    /// Which windows are filled (ready to run).
    filled: Vec<bool>,
    /// Which windows stay filled (resident) rather than leave after each use.
    kept: Vec<bool>,
    /// Read ahead by reading (`MADV_POPULATE_READ`) rather than by hint.
    force: bool,
}

/// The bytes of the model's layers `layers`' tensors in `file`.
pub fn layer_bytes(file: &GgufFile, layers: Range<usize>) -> u64 {
    file.tensors().iter().filter(|t| layer_of(&t.name).is_some_and(|l| layers.contains(&l))).map(|t| t.n_bytes).sum()
}

/// A device's budget for its windows: the bytes of their caches (`kv_bytes`), of what
/// it holds besides (`fixed`: the head's embedding and LM head) and of their weights set
/// against its `memory` (0: no budget).
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub weights: u64,
    pub kv_bytes: u64,
    pub fixed: u64,
    pub memory: u64,
}

impl Budget {
    /// `windows` of `file` with caches of `kv_tokens` tokens of `kv_bytes_per_layer_token`
    /// per layer, under `memory`.
    pub fn of(file: &GgufFile, windows: &[Range<usize>], kv_bytes_per_layer_token: usize, kv_tokens: usize, memory: u64) -> Budget {
        let weights = windows.iter().map(|w| layer_bytes(file, w.clone())).sum();
        let held: usize = windows.iter().map(|w| w.len()).sum();
        Budget { weights, kv_bytes: (held * kv_bytes_per_layer_token * kv_tokens) as u64, fixed: 0, memory }
    }

    /// The budget with `bytes` more held besides the windows.
    pub fn with_fixed(self, bytes: u64) -> Budget {
        Budget { fixed: self.fixed + bytes, ..self }
    }

    /// Whether the windows must be streamed: weights and caches exceed the memory.
    pub fn streams(&self) -> bool {
        self.memory > 0 && self.weights + self.kv_bytes + self.fixed > self.memory
    }

    /// The memory left for the windows' weights beside the rest.
    pub fn for_weights(&self) -> u64 {
        self.memory.saturating_sub(self.kv_bytes + self.fixed)
    }
}

/// The bytes of `file`'s tensors of no layer (the embedding, the final norm, the LM head):
/// what a ring's head holds besides its windows.
pub fn outside_layers_bytes(file: &GgufFile) -> u64 {
    file.tensors().iter().filter(|t| layer_of(&t.name).is_none()).map(|t| t.n_bytes).sum()
}

fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

impl Streamer {
    /// Streams `windows` of `model`, loaded from `file` with
    /// [`Matrices::Streamed`](blink_model::Matrices::Streamed) (or `Refilled`), keeping resident the windows
    /// that fit in `budget` bytes beside room for the largest of them (in order: the
    /// first ones).
    pub fn new(file: Arc<GgufFile>, model: Arc<Model>, windows: &[Range<usize>], budget: u64, force: bool) -> Streamer {
        let n = windows.len();
        let mut s = Streamer { file, model, windows: windows.to_vec(), filled: vec![false; n], kept: vec![false; n], force };
        let bytes: Vec<u64> = (0..n).map(|w| s.bytes(w) as u64).collect();
        let mut room = budget.saturating_sub(bytes.iter().copied().max().unwrap_or(0));
        for (kept, &b) in s.kept.iter_mut().zip(&bytes).take(n.saturating_sub(1)) {
            if b > room {
                break;
            }
            room -= b;
            *kept = true;
        }
        s
    }

    /// How many windows stay resident.
    pub fn n_kept(&self) -> usize {
        self.kept.iter().filter(|&&k| k).count()
    }

    /// Bytes read from the file for each pass over the windows: the streamed ones'.
    pub fn streamed_bytes(&self) -> usize {
        (0..self.n_windows()).filter(|&w| !self.kept[w]).map(|w| self.bytes(w)).sum()
    }

    fn matrices(&self, w: usize) -> impl Iterator<Item = &Matrix> + '_ {
        let part = &self.model.parts[0];
        self.windows[w].clone().flat_map(move |l| part.layer(l).matrices())
    }

    /// The file's bytes of matrix `m`.
    fn source(&self, m: &Matrix) -> &[u8] {
        m.source(&self.file)
    }

    /// Make window `w` ready to run: its row-major matrices read ahead, its repacked ones
    /// refilled (each file tensor's pages given back once it is repacked).
    ///
    /// # Safety
    /// No step may run on the model meanwhile.
    pub unsafe fn fill(&mut self, w: usize) {
        self.filled[w] = true;
        // Each matrix's pages are asked for one matrix ahead of its repacking: the disk
        // has work queued while a matrix is repacked, and no more of the file is in
        // memory than the two (under a tight limit, pages read too far ahead would be
        // evicted before use).
        let matrices: Vec<&Matrix> = self.matrices(w).collect();
        if let Some(m) = matrices.first() {
            let _ = residency::prefetch(self.source(m), false);
        }
        for (i, m) in matrices.iter().enumerate() {
            if let Some(next) = matrices.get(i + 1) {
                let _ = residency::prefetch(self.source(next), false);
            }
            let src = self.source(m);
            if m.refillable() {
                // SAFETY: no step runs (the caller's promise).
                unsafe { m.refill(src) };
                // SAFETY: the file's map is read-only and shared.
                let _ = unsafe { residency::release(src, self.file.file_range(src)) };
            } else if self.force {
                let _ = residency::prefetch(src, true);
            }
        }
    }

    /// Give window `w`'s memory back, repacked copies and file pages alike.
    ///
    /// # Safety
    /// No step may run on the model meanwhile, and `w` must be filled again before it runs.
    pub unsafe fn release(&mut self, w: usize) {
        self.filled[w] = false;
        for m in self.matrices(w) {
            // SAFETY: as the caller promises; a window's matrices are refilled together
            // before it runs, after any other window's release.
            unsafe { m.forget() };
        }
        // The file's pages go as one span (the window's tensors lie together): the page
        // cache keeps a large folio that straddles a range's end, and a span has two
        // ends where each matrix has its own.
        let (start, end) = self.matrices(w).map(|m| self.source(m).as_ptr_range()).fold((usize::MAX, 0), |(s, e), r| (s.min(r.start as usize), e.max(r.end as usize)));
        if start < end {
            let map = self.file.bytes();
            let span = &map[start - map.as_ptr() as usize..end - map.as_ptr() as usize];
            // SAFETY: the file's map is read-only and shared.
            let _ = unsafe { residency::release(span, self.file.file_range(span)) };
        }
    }

    /// Bytes of window `w`'s matrices resident now (repacked copies, or the file's pages
    /// for the ones kept row-major), as `mincore` sees them.
    pub fn resident(&self, w: usize) -> usize {
        self.matrices(w).map(|m| residency::resident(m.bytes()).unwrap_or(0).min(m.bytes().len())).sum()
    }

    /// Bytes of window `w`'s matrices.
    pub fn bytes(&self, w: usize) -> usize {
        self.matrices(w).map(|m| m.bytes().len()).sum()
    }

    pub fn n_windows(&self) -> usize {
        self.windows.len()
    }

    /// Before the first step: fill the resident windows and the first streamed one.
    ///
    /// # Safety
    /// No step may run on the model meanwhile.
    pub unsafe fn start(&mut self) {
        for w in 0..self.n_windows() {
            if self.kept[w] || w == self.n_kept() {
                // SAFETY: as the caller promises.
                unsafe { self.ensure(w) };
            }
        }
    }

    /// Fill window `w` unless it is filled: before it runs.
    ///
    /// # Safety
    /// No step may run on the model meanwhile.
    pub unsafe fn ensure(&mut self, w: usize) {
        if !self.filled[w] {
            // SAFETY: as the caller promises.
            unsafe { self.fill(w) };
        }
    }

    /// Window `w` has run and its output is on its way: a streamed window is given back
    /// and the next streamed one made ready (unless it is the same window, which stays).
    ///
    /// # Safety
    /// No step may run on the model meanwhile.
    pub unsafe fn done(&mut self, w: usize) {
        if self.kept[w] {
            return;
        }
        let n = self.n_windows();
        let next = (1..=n).map(|i| (w + i) % n).find(|&v| !self.kept[v]).unwrap_or(w);
        if next != w {
            // SAFETY: as the caller promises; `next` is filled after `w`'s release.
            unsafe {
                self.release(w);
                self.ensure(next);
            }
        }
    }
}
