//! Streamed windows on a private copy of the default model: read ahead, a window's pages
//! are resident (as `mincore` sees them); given back, they leave memory, page cache
//! included; reading them again brings back the same bytes.

use std::sync::Arc;

use blink_cluster::stream::{layer_bytes, Streamer};
use blink_gguf::GgufFile;

#[test]
fn windows_come_in_ahead_and_leave_for_real() {
    let model = blink_model::fetch::ensure_default_model().expect("the default model");
    // A copy of our own: another process mapping the same file would keep its pages.
    let copy = std::env::temp_dir().join(format!("blink-stream-{}.gguf", std::process::id()));
    std::fs::copy(&model, &copy).unwrap();
    // Written pages must reach the disk before the page cache may drop them.
    std::fs::File::open(&copy).unwrap().sync_all().unwrap();
    let file = Arc::new(GgufFile::open(&copy).unwrap());
    let windows = [0..10, 10..20, 20..30];
    let s = Streamer::new(file.clone(), &windows, true);
    for (w, layers) in windows.iter().enumerate() {
        let bytes = s.bytes(w);
        assert!(bytes as u64 >= layer_bytes(&file, layers.clone()), "window {w}: its spans cover its tensors");
        s.release(w);
        // (A span may take in a neighbour's small tensor between two of its own, which
        // stays: at most a few pages.)
        assert!(s.resident(w) < bytes / 20, "window {w}: {} of {bytes} bytes still resident after release", s.resident(w));
    }
    let checksum = |w: usize| -> u64 {
        let t = file.tensors().iter().find(|t| t.name == format!("blk.{}.ffn_down.weight", windows[w].start)).unwrap();
        file.tensor_data(t).iter().map(|&b| b as u64).sum()
    };
    let before = checksum(1);
    s.release(1);
    s.prefetch(1);
    let (resident, bytes) = (s.resident(1), s.bytes(1));
    assert!(resident >= bytes, "window 1: {resident} of {bytes} bytes resident after prefetch");
    assert!(s.resident(2) < s.bytes(2) / 2, "window 2 was not asked for");
    // `done` gives a window back and reads the next one ahead.
    s.done(1);
    assert!(s.resident(1) < bytes / 20);
    assert!(s.resident(2) >= s.bytes(2));
    assert_eq!(checksum(1), before, "a released window reads back the same bytes");
    drop(s);
    drop(file);
    let _ = std::fs::remove_file(&copy);
}
