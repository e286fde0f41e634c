//! Fuzzes the GGUF reader: any input must yield an error or a file whose every metadata
//! value and tensor byte can be read.

#![no_main]

use blink_gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let mut checksum = 0u64;
    for (key, value) in file.metadata() {
        assert!(file.get(key).is_some());
        checksum = checksum.wrapping_add(value.to_string().len() as u64);
        if let Some(array) = value.as_array() {
            checksum = checksum.wrapping_add(array.len() as u64);
        }
    }
    for t in file.tensors() {
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.n_bytes);
        assert!(file.data_offset() + t.offset + t.n_bytes <= file.file_size());
        checksum = bytes
            .iter()
            .fold(checksum, |acc, &b| acc.wrapping_add(u64::from(b)));
    }
    std::hint::black_box(checksum);
});
