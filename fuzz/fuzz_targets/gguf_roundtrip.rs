//! Fuzzes reader/writer agreement: whatever the reader accepts, the writer must accept, and
//! re-reading the written file must reproduce it byte for byte.

#![no_main]

use blink_gguf::{GgufFile, GgufWriter};
use libfuzzer_sys::fuzz_target;

fn rewrite(file: &GgufFile) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        w.add(key.clone(), value.clone())
            .expect("writer rejects metadata the reader accepted");
    }
    for t in file.tensors() {
        w.add_tensor(t.name.clone(), t.ty, &t.dims, file.tensor_data(t))
            .expect("writer rejects a tensor the reader accepted");
    }
    w.to_bytes()
}

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let first = rewrite(&file);
    let again = GgufFile::from_bytes(first.clone()).expect("writer output does not read back");
    assert_eq!(again.tensors().len(), file.tensors().len());
    assert_eq!(rewrite(&again), first);
});
