//! Truncation at every byte, seeded random bytes and random corruption of valid files:
//! the reader must return an error or a file that behaves, and never panic.

mod common;

use blink_gguf::{GgufError, GgufFile, GgufWriter};
use common::{expect_err, sample_file, sample_writer, touch_everything, Raw, XorShift};

#[test]
fn every_truncation_is_an_error() {
    let full = sample_file();
    let f = GgufFile::from_bytes(full.clone()).unwrap();
    let data_offset = f.data_offset() as usize;
    for len in 0..full.len() {
        let e = expect_err(full[..len].to_vec());
        let msg = e.to_string();
        if len < data_offset {
            // Cut in the header, metadata, tensor table or the padding after it.
            assert!(
                matches!(
                    e,
                    GgufError::Truncated { .. } | GgufError::CountTooLarge { .. }
                ) || msg.contains("extends past the end of the file"),
                "prefix {len}: {msg}"
            );
        } else {
            assert!(
                msg.contains("extends past the end of the file"),
                "prefix {len}: {msg}"
            );
        }
    }
}

#[test]
fn every_truncation_of_a_v2_file_with_alignment_is_an_error() {
    let mut w = sample_writer();
    w.set_alignment(8).unwrap();
    let mut full = w.to_bytes();
    full[4] = 2;
    assert!(GgufFile::from_bytes(full.clone()).is_ok());
    for len in 0..full.len() {
        expect_err(full[..len].to_vec());
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = XorShift::new(0x5eed);
    let mut opened = 0;
    for i in 0..20_000 {
        let len = rng.below(300) as usize;
        let mut bytes = rng.bytes(len);
        // Most inputs get a plausible header so parsing goes beyond the magic.
        if i % 4 != 0 && len >= 24 {
            bytes[..4].copy_from_slice(b"GGUF");
            bytes[4..8].copy_from_slice(&3u32.to_le_bytes());
            bytes[8..16].copy_from_slice(&rng.below(4).to_le_bytes());
            bytes[16..24].copy_from_slice(&rng.below(4).to_le_bytes());
        }
        match GgufFile::from_bytes(bytes) {
            Ok(f) => {
                touch_everything(&f);
                opened += 1;
            }
            Err(e) => assert!(!e.to_string().contains('\n')),
        }
    }
    // Zero counts with any trailing bytes form a valid empty file.
    assert!(opened > 0);
}

/// Mutates a valid file: overwrites bytes, sets u64 fields to extremes, or cuts it.
fn mutate(rng: &mut XorShift, bytes: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(bytes.len() as u64) as usize;
        match rng.below(4) {
            0 => bytes[at] = rng.next_u64() as u8,
            1 => bytes[at] ^= 1 << rng.below(8),
            2 => {
                let value =
                    [0, 1, u64::MAX, 1 << 40, 1 << 63, rng.below(64)][rng.below(6) as usize];
                let end = (at + 8).min(bytes.len());
                bytes[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
            }
            _ => bytes.truncate(at),
        }
        if bytes.is_empty() {
            return;
        }
    }
}

#[test]
fn corrupted_valid_files_never_panic() {
    let mut alt = sample_writer();
    alt.set_alignment(16).unwrap();
    let seeds = [sample_file(), alt.to_bytes()];
    let mut rng = XorShift::new(42);
    let (mut ok, mut err) = (0, 0);
    for i in 0..30_000 {
        let mut bytes = seeds[i % seeds.len()].clone();
        mutate(&mut rng, &mut bytes);
        match GgufFile::from_bytes(bytes) {
            Ok(f) => {
                touch_everything(&f);
                ok += 1;
            }
            Err(e) => {
                assert!(!e.to_string().contains('\n'));
                err += 1;
            }
        }
    }
    // Both outcomes are exercised: some mutations hit tensor data, most break structure.
    assert!(ok > 100 && err > 10_000, "ok {ok}, err {err}");
}

#[test]
fn random_structured_files_round_trip_or_error() {
    // Random but valid metadata built through the writer always reads back equal.
    let mut rng = XorShift::new(7);
    for _ in 0..300 {
        let mut w = GgufWriter::new();
        let n = rng.below(6);
        for k in 0..n {
            let key = format!("k.{k}");
            let len = rng.below(5) as usize;
            let value: blink_gguf::Value = match rng.below(4) {
                0 => rng.next_u64().into(),
                1 => (0..len)
                    .map(|_| rng.next_u64() as i32)
                    .collect::<Vec<_>>()
                    .into(),
                2 => (0..len).map(|i| format!("s{i}")).collect::<Vec<_>>().into(),
                _ => (rng.next_u64() as f32).into(),
            };
            w.add(key, value).unwrap();
        }
        let bytes = w.to_bytes();
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        assert_eq!(f.metadata().len() as u64, n);
        // A random truncation of it is always an error (nothing is optional).
        if bytes.len() > 24 {
            let cut = 24 + rng.below(bytes.len() as u64 - 24) as usize;
            if cut < bytes.len() {
                expect_err(bytes[..cut].to_vec());
            }
        }
    }
    // The header-only file is valid; one byte less is not.
    let empty = Raw::new(0, 0).done();
    assert!(GgufFile::from_bytes(empty.clone()).is_ok());
    expect_err(empty[..23].to_vec());
}
