//! Streamed weights: a device whose windows do not fit its memory budget keeps their
//! matrices in the file's map (not copied), reads the next window ahead while it sends
//! the last one's output on, and gives the last one's memory back for real (the
//! mapping's pages and the page cache's; see `blink_runtime::residency`).

use std::ops::Range;
use std::sync::Arc;

use blink_gguf::GgufFile;
use blink_runtime::residency;

/// Where each window's tensors lie in the file.
pub struct Streamer {
    file: Arc<GgufFile>,
    /// Per window, its tensors' byte ranges in the file (merged where they touch).
    spans: Vec<Vec<Range<usize>>>,
    /// Prefetch by reading (`MADV_POPULATE_READ`) rather than by hint.
    force: bool,
}

/// The bytes of the model's layers `layers`' tensors in `file`.
pub fn layer_bytes(file: &GgufFile, layers: Range<usize>) -> u64 {
    file.tensors().iter().filter(|t| layer_of(&t.name).is_some_and(|l| layers.contains(&l))).map(|t| t.n_bytes).sum()
}

fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

impl Streamer {
    pub fn new(file: Arc<GgufFile>, windows: &[Range<usize>], force: bool) -> Streamer {
        let base = file.tensor_data(&file.tensors()[0]).as_ptr() as usize;
        let spans = windows
            .iter()
            .map(|w| {
                let mut ranges: Vec<Range<usize>> = file
                    .tensors()
                    .iter()
                    .filter(|t| layer_of(&t.name).is_some_and(|l| w.contains(&l)))
                    .map(|t| {
                        let d = file.tensor_data(t);
                        let at = d.as_ptr() as usize - base;
                        at..at + d.len()
                    })
                    .collect();
                ranges.sort_by_key(|r| r.start);
                let mut merged: Vec<Range<usize>> = Vec::new();
                for r in ranges {
                    match merged.last_mut() {
                        // Tensors are aligned to 32 bytes or so: a small gap is the padding.
                        Some(last) if r.start <= last.end + 4096 => last.end = last.end.max(r.end),
                        _ => merged.push(r),
                    }
                }
                merged
            })
            .collect();
        Streamer { file, spans, force }
    }

    fn slices(&self, w: usize) -> impl Iterator<Item = &[u8]> + '_ {
        let first = &self.file.tensors()[0];
        let data = self.file.tensor_data(first);
        // The data section from the first tensor on: every span is inside it.
        let base = data.as_ptr();
        self.spans[w].iter().map(move |r| {
            // SAFETY: each span was measured from tensor slices of this file's bytes, which
            // the Streamer keeps alive.
            unsafe { std::slice::from_raw_parts(base.add(r.start), r.len()) }
        })
    }

    /// Read window `w` ahead of use.
    pub fn prefetch(&self, w: usize) {
        for s in self.slices(w) {
            let _ = residency::prefetch(s, self.force);
        }
    }

    /// Give window `w`'s memory back.
    pub fn release(&self, w: usize) {
        for s in self.slices(w) {
            // SAFETY: the file's map is read-only and shared.
            let _ = unsafe { residency::release(s, self.file.file_range(s)) };
        }
    }

    /// Bytes of window `w` resident now.
    pub fn resident(&self, w: usize) -> usize {
        self.slices(w).map(|s| residency::resident(s).unwrap_or(0)).sum()
    }

    /// Bytes of window `w`'s tensors.
    pub fn bytes(&self, w: usize) -> usize {
        self.spans[w].iter().map(|r| r.len()).sum()
    }

    /// Window `w` has run and its output is on its way: give it back and read the next
    /// one ahead (unless it is the same window).
    pub fn done(&self, w: usize) {
        let n = self.spans.len();
        self.release(w);
        let next = (w + 1) % n;
        if next != w {
            self.prefetch(next);
        }
    }
}
