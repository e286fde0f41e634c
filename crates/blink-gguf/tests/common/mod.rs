//! Helpers shared by the integration tests: a raw byte builder for hand-made (often
//! hostile) files, a small valid sample file, a seeded xorshift generator, and error checks.

#![allow(dead_code)]

use blink_gguf::{Array, GgmlType, GgufError, GgufFile, GgufWriter, Value};

/// Metadata value type ids, as stored in files.
pub mod vt {
    pub const U8: u32 = 0;
    pub const U16: u32 = 2;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
}

/// Builds GGUF bytes field by field, with no validation at all.
pub struct Raw(pub Vec<u8>);

impl Raw {
    /// Magic, version 3 and the two counts.
    pub fn new(n_tensors: u64, n_kv: u64) -> Raw {
        Raw(Vec::new())
            .bytes(b"GGUF")
            .u32(3)
            .u64(n_tensors)
            .u64(n_kv)
    }

    pub fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }

    pub fn u8(self, v: u8) -> Raw {
        self.bytes(&[v])
    }

    pub fn u32(self, v: u32) -> Raw {
        self.bytes(&v.to_le_bytes())
    }

    pub fn u64(self, v: u64) -> Raw {
        self.bytes(&v.to_le_bytes())
    }

    /// A length-prefixed string of arbitrary bytes.
    pub fn str_bytes(self, s: &[u8]) -> Raw {
        self.u64(s.len() as u64).bytes(s)
    }

    pub fn str(self, s: &str) -> Raw {
        self.str_bytes(s.as_bytes())
    }

    /// A metadata entry `key` of type `ty` followed by `payload` as the value bytes.
    pub fn kv(self, key: &str, ty: u32, payload: &[u8]) -> Raw {
        self.str(key).u32(ty).bytes(payload)
    }

    pub fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.kv(key, vt::U32, &v.to_le_bytes())
    }

    pub fn kv_str(self, key: &str, v: &str) -> Raw {
        self.str(key).u32(vt::STRING).str(v)
    }

    /// A tensor-table entry.
    pub fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }

    /// Zero bytes up to the next multiple of `alignment`.
    pub fn pad(mut self, alignment: usize) -> Raw {
        let len = self.0.len().div_ceil(alignment) * alignment;
        self.0.resize(len, 0);
        self
    }

    pub fn zeros(mut self, n: usize) -> Raw {
        self.0.resize(self.0.len() + n, 0);
        self
    }

    pub fn done(self) -> Vec<u8> {
        self.0
    }
}

/// A seeded xorshift64* generator: deterministic randomness without extra dependencies.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Deterministic filler bytes for tensor data.
pub fn filler(n: usize, seed: u64) -> Vec<u8> {
    XorShift::new(seed).bytes(n)
}

/// A small valid file: several value types, a nested array, three tensors of three types.
pub fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    w.add("llama.block_count", 2u32).unwrap();
    w.add("llama.rope.freq_base", 10000.0f32).unwrap();
    w.add("tokenizer.ggml.add_bos_token", true).unwrap();
    w.add(
        "tokenizer.ggml.tokens",
        vec!["<s>".to_string(), "héllo".to_string()],
    )
    .unwrap();
    w.add("tokenizer.ggml.token_type", vec![1i32, -2]).unwrap();
    w.add(
        "test.nested",
        Value::Array(Array::Array(vec![Array::U8(vec![1, 2])])),
    )
    .unwrap();
    w.add_tensor("a", GgmlType::F32, &[4, 2], &filler(32, 1))
        .unwrap();
    w.add_tensor("b", GgmlType::Q8_0, &[32], &filler(34, 2))
        .unwrap();
    w.add_tensor("c", GgmlType::Q4_1, &[32, 2], &filler(40, 3))
        .unwrap();
    w
}

pub fn sample_file() -> Vec<u8> {
    sample_writer().to_bytes()
}

/// Parses `bytes`, insisting on an error whose message is a single line.
pub fn expect_err(bytes: Vec<u8>) -> GgufError {
    match GgufFile::from_bytes(bytes) {
        Ok(f) => panic!("expected an error, but the file opened: {f:?}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                !msg.contains('\n') && !msg.contains('\r'),
                "multi-line message: {msg:?}"
            );
            e
        }
    }
}

/// Parses `bytes`, insisting on an error whose message contains every one of `needles`.
pub fn expect_msg(bytes: Vec<u8>, needles: &[&str]) -> GgufError {
    let e = expect_err(bytes);
    let msg = e.to_string();
    for needle in needles {
        assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
    }
    e
}

/// Reads everything a valid file offers, so a bad `GgufFile` would be caught misbehaving.
pub fn touch_everything(f: &GgufFile) {
    for (key, value) in f.metadata() {
        assert!(f.get(key).is_some());
        let shown = value.to_string();
        assert!(!shown.contains('\n'));
    }
    for t in f.tensors() {
        let data = f.tensor_data(t);
        assert_eq!(data.len() as u64, t.n_bytes);
        assert_eq!(f.tensor(&t.name), Some(t));
        assert!(f.data_offset() + t.offset + t.n_bytes <= f.file_size());
    }
}
