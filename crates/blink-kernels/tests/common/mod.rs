//! Shared test helpers: the checked-in fixture files (format "BKF1", written by
//! `tests/fixtures/make_fixtures.py`) and small numeric utilities.

#![allow(dead_code)]

use std::collections::HashMap;

use blink_gguf::GgmlType;

/// A fixture file: named byte records.
pub struct Fixture {
    name: &'static str,
    records: HashMap<String, Vec<u8>>,
}

impl Fixture {
    /// Load `tests/fixtures/<name>`.
    pub fn load(name: &'static str) -> Fixture {
        let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(&data[..4], b"BKF1", "{path}: bad magic");
        let mut records = HashMap::new();
        let mut rest = &data[4..];
        while !rest.is_empty() {
            let (len, r) = rest.split_at(2);
            let (key, r) = r.split_at(u16::from_le_bytes(len.try_into().unwrap()) as usize);
            let (len, r) = r.split_at(4);
            let (payload, r) = r.split_at(u32::from_le_bytes(len.try_into().unwrap()) as usize);
            records.insert(String::from_utf8(key.to_vec()).unwrap(), payload.to_vec());
            rest = r;
        }
        Fixture { name, records }
    }

    pub fn bytes(&self, key: &str) -> &[u8] {
        self.records
            .get(key)
            .unwrap_or_else(|| panic!("{}: no record {key}", self.name))
    }

    pub fn f32s(&self, key: &str) -> Vec<f32> {
        to_f32s(self.bytes(key))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.records.keys().map(String::as_str)
    }
}

pub fn to_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub fn ggml_type(name: &str) -> GgmlType {
    GgmlType::ALL
        .into_iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("unknown type {name}"))
}

/// Bytes of a row of `n` elements.
pub fn row_bytes(ty: GgmlType, n: usize) -> usize {
    ty.row_bytes(n as u64).unwrap() as usize
}

/// A deterministic xorshift generator, so tests need no seeding ceremony.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Approximately standard normal (sum of uniforms).
    pub fn normal(&mut self) -> f32 {
        (0..12).map(|_| self.uniform()).sum::<f32>() - 6.0
    }
}
