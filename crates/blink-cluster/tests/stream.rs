//! Streamed windows on a private copy of the default model: a filled window's matrices
//! are resident (as `mincore` sees them), a released one's are gone (repacked copies and
//! page cache alike), and `done` gives one window back and fills the next; windows within
//! the budget stay.

use std::sync::Arc;

use blink_cluster::stream::{layer_bytes, Streamer};
use blink_gguf::GgufFile;
use blink_model::{Matrices, Model, Share, TensorPlacement};

#[test]
fn mapped_windows_come_in_before_use_and_leave_for_real() {
    windows_come_in_before_use_and_leave_for_real(Matrices::Streamed);
}

#[test]
fn refilled_windows_come_in_before_use_and_leave_for_real() {
    windows_come_in_before_use_and_leave_for_real(Matrices::Refilled);
}

/// `matrices`: left in the file's map where the kernels read it (every type on x86), or
/// repacked copies refilled before each use (as on NEON).
fn windows_come_in_before_use_and_leave_for_real(matrices: Matrices) {
    let model = blink_model::fetch::ensure_default_model().expect("the default model");
    // A copy of our own: another process mapping the same file would keep its pages.
    let copy = std::env::temp_dir().join(format!("blink-stream-{}-{matrices:?}.gguf", std::process::id()));
    std::fs::copy(&model, &copy).unwrap();
    // Written pages must reach the disk before the page cache may drop them.
    std::fs::File::open(&copy).unwrap().sync_all().unwrap();
    let file = Arc::new(GgufFile::open(&copy).unwrap());
    let windows = [0..10, 10..20, 20..30];
    let model = Model::from_gguf_share(file.clone(), &TensorPlacement::flat(1), Share::windows(windows.to_vec(), matrices)).unwrap();
    let model = Arc::new(model);
    let mut s = Streamer::new(file.clone(), model.clone(), &windows, 0, true);
    assert_eq!(s.n_kept(), 0, "no budget: every window streams");
    // (A mapped matrix's pages may take in a neighbouring tensor's: a few pages at most.)
    let gone = |s: &Streamer, w: usize| s.resident(w) < s.bytes(w) / 20;
    let here = |s: &Streamer, w: usize| s.resident(w) >= s.bytes(w) * 95 / 100;
    for (w, layers) in windows.iter().enumerate() {
        assert!(s.bytes(w) as u64 >= layer_bytes(&file, layers.clone()) * 9 / 10, "window {w}'s matrices are most of its bytes");
        unsafe { s.release(w) };
        assert!(gone(&s, w), "window {w}: {} of {} bytes resident after release", s.resident(w), s.bytes(w));
    }
    unsafe { s.fill(1) };
    assert!(here(&s, 1), "window 1: {} of {} bytes resident after filling", s.resident(1), s.bytes(1));
    assert!(gone(&s, 0) && gone(&s, 2), "only window 1 was filled");
    unsafe { s.done(1) };
    assert!(gone(&s, 1) && here(&s, 2), "done(1) gives 1 back and fills 2: {} and {}", s.resident(1), s.resident(2));
    // Room for one window beside the largest: the first stays, the others stream.
    let budget = s.bytes(0) + (0..3).map(|w| s.bytes(w)).max().unwrap();
    drop(s);
    let mut s = Streamer::new(file.clone(), model, &windows, budget as u64, true);
    assert_eq!(s.n_kept(), 1, "one window fits beside the room for a streamed one");
    assert_eq!(s.streamed_bytes(), s.bytes(1) + s.bytes(2));
    for w in 0..3 {
        unsafe { s.release(w) };
    }
    unsafe { s.start() };
    assert!(here(&s, 0) && here(&s, 1) && gone(&s, 2), "start fills the kept window and the first streamed one");
    unsafe { s.done(0) };
    assert!(here(&s, 0) && here(&s, 1), "a kept window stays after its use");
    unsafe { s.done(1) };
    assert!(here(&s, 0) && gone(&s, 1) && here(&s, 2), "a streamed one leaves for the next streamed one");
    unsafe { s.done(2) };
    assert!(here(&s, 0) && here(&s, 1) && gone(&s, 2), "round the ring, past the kept window");
    drop(s);
    drop(file);
    let _ = std::fs::remove_file(&copy);
}
