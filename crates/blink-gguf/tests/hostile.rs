//! Hand-built hostile files: each must fail with an error (never a panic) whose one-line
//! message names the problem and where it is.

mod common;

use blink_gguf::{GgufError, GgufFile};
use common::{expect_err, expect_msg, vt, Raw};

const F32: u32 = 0;
const Q4_1: u32 = 3;

/// One metadata entry, one F32 tensor `t` of `dims`, data padded to 32 and `data_len` bytes.
fn one_tensor(dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
    Raw::new(1, 1)
        .kv_str("general.name", "x")
        .tensor("t", dims, ty, offset)
        .pad(32)
        .zeros(data_len)
        .done()
}

fn message(bytes: Vec<u8>) -> String {
    expect_err(bytes).to_string()
}

#[test]
fn baseline_raw_file_is_valid() {
    let f = GgufFile::from_bytes(one_tensor(&[4], F32, 0, 16)).unwrap();
    assert_eq!(f.tensor_data(&f.tensors()[0]).len(), 16);
}

#[test]
fn bad_magic() {
    let e = expect_err(Raw(b"GGML".to_vec()).u32(3).u64(0).u64(0).done());
    assert!(matches!(e, GgufError::BadMagic { .. }));
    assert_eq!(
        e.to_string(),
        "bad magic: expected \"GGUF\", found \"GGML\" (not a GGUF file)"
    );
    let e = message(vec![0, 1, 0xff, b'\n', 0]);
    assert_eq!(
        e,
        "bad magic: expected \"GGUF\", found \"\\x00\\x01\\xff\\n\" (not a GGUF file)"
    );
    assert_eq!(
        message(b"GGU".to_vec()),
        "truncated file: header magic needs 4 bytes at offset 0, only 3 left"
    );
}

#[test]
fn unsupported_versions() {
    let with_version = |v: u32| Raw(b"GGUF".to_vec()).u32(v).u64(0).u64(0).done();
    let e = expect_err(with_version(1));
    assert!(matches!(e, GgufError::UnsupportedVersion { version: 1 }));
    assert!(e
        .to_string()
        .starts_with("unsupported GGUF version 1 (GGUF v1 is obsolete"));
    assert_eq!(
        message(with_version(4)),
        "unsupported GGUF version 4 (supported versions: 2, 3)"
    );
    assert_eq!(
        message(with_version(0)),
        "unsupported GGUF version 0 (supported versions: 2, 3)"
    );
    let e = message(with_version(0x0300_0000));
    assert!(
        e.starts_with("unsupported GGUF version 50331648 (the value looks byte-swapped"),
        "{e}"
    );
    assert!(e.contains("big-endian"));
    expect_msg(
        b"GGUF\x03\0".to_vec(),
        &["header version needs 4 bytes at offset 4, only 2 left"],
    );
}

#[test]
fn absurd_counts() {
    for count in [u64::MAX, 1 << 40, 1 << 20] {
        let e = message(Raw::new(count, 0).zeros(64).done());
        assert_eq!(
            e,
            format!(
                "header tensor count at offset 8 claims {count} entries of at least 33 bytes each, \
                 but only 64 bytes remain"
            )
        );
        let e = message(Raw::new(0, count).zeros(64).done());
        assert!(
            e.starts_with(&format!(
                "header metadata count at offset 16 claims {count} entries"
            )),
            "{e}"
        );
    }
    expect_msg(
        Raw::new(0, 0).done()[..20].to_vec(),
        &["header metadata count needs 8 bytes at offset 16"],
    );
}

#[test]
fn absurd_key_lengths() {
    let e = message(Raw::new(0, 1).u64(u64::MAX).zeros(16).done());
    assert_eq!(
        e,
        "metadata key #0 name at offset 24: string length 18446744073709551615 exceeds the limit of 65536 bytes"
    );
    // Present, but over the key limit.
    let e = message(
        Raw::new(0, 1)
            .str(&"k".repeat(70_000))
            .u32(vt::U8)
            .u8(0)
            .done(),
    );
    assert!(
        e.contains("string length 70000 exceeds the limit of 65536"),
        "{e}"
    );
    // Under the limit, but past the end.
    let e = message(Raw::new(0, 1).u64(100).bytes(b"abcdefgh").done());
    assert_eq!(
        e,
        "truncated file: metadata key #0 name needs 100 bytes at offset 32, only 8 left"
    );
}

#[test]
fn absurd_string_values() {
    let e = message(
        Raw::new(0, 1)
            .str("general.name")
            .u32(vt::STRING)
            .u64(1 << 40)
            .zeros(8)
            .done(),
    );
    assert_eq!(
        e,
        "metadata key #0 ('general.name') value at offset 48: string length 1099511627776 \
         exceeds the limit of 67108864 bytes"
    );
    let e = message(
        Raw::new(0, 1)
            .str("general.name")
            .u32(vt::STRING)
            .u64(12)
            .bytes(b"abcd")
            .done(),
    );
    assert_eq!(
        e,
        "truncated file: metadata key #0 ('general.name') value needs 12 bytes at offset 56, only 4 left"
    );
}

#[test]
fn absurd_array_counts() {
    let array_of = |ty: u32, count: u64| {
        Raw::new(0, 1)
            .str("arr")
            .u32(vt::ARRAY)
            .u32(ty)
            .u64(count)
            .zeros(40)
            .done()
    };
    let e = message(array_of(vt::U32, u64::MAX));
    assert_eq!(
        e,
        "metadata key #0 ('arr') value array length at offset 43 claims 18446744073709551615 \
         entries of at least 4 bytes each, but only 40 bytes remain"
    );
    let e = message(array_of(vt::STRING, 1 << 40));
    assert!(
        e.contains("claims 1099511627776 entries of at least 8 bytes each"),
        "{e}"
    );
    let e = message(array_of(vt::ARRAY, 1 << 40));
    assert!(e.contains("entries of at least 12 bytes each"), "{e}");
    // Five strings claimed, the third runs off the end.
    let e = message(
        Raw::new(0, 1)
            .str("arr")
            .u32(vt::ARRAY)
            .u32(vt::STRING)
            .u64(5)
            .str("a")
            .str("b")
            .u64(1000)
            .zeros(30)
            .done(),
    );
    assert!(
        e.starts_with("truncated file: metadata key #0 ('arr') value element #2 needs 1000 bytes"),
        "{e}"
    );
}

/// An array nested `depth` levels deep, innermost an empty u8 array.
fn nested(depth: usize) -> Vec<u8> {
    let mut r = Raw::new(0, 1).str("deep").u32(vt::ARRAY);
    for _ in 1..depth {
        r = r.u32(vt::ARRAY).u64(1);
    }
    r.u32(vt::U8).u64(0).done()
}

#[test]
fn nested_arrays_are_capped() {
    let f = GgufFile::from_bytes(nested(4)).unwrap();
    assert_eq!(f.get("deep").unwrap().type_name(), "array[array]");
    let e = message(nested(5));
    assert!(
        e.starts_with("metadata key #0 ('deep') value element #0 element #0 element #0 element #0"),
        "{e}"
    );
    assert!(e.ends_with("arrays nested more than 4 levels deep"), "{e}");
    // A long chain must not recurse without bound.
    assert!(matches!(
        expect_err(nested(100_000)),
        GgufError::ArrayTooDeep { .. }
    ));
}

#[test]
fn unknown_value_types_and_bad_bools() {
    let e = message(Raw::new(0, 1).str("k").u32(13).u64(0).done());
    assert_eq!(
        e,
        "metadata key #0 ('k') value at offset 33: unknown value type id 13"
    );
    let e = message(
        Raw::new(0, 1)
            .str("k")
            .u32(vt::ARRAY)
            .u32(u32::MAX)
            .u64(0)
            .done(),
    );
    assert!(
        e.contains("('k') value array element type at offset 37: unknown value type id 4294967295"),
        "{e}"
    );
    let e = message(Raw::new(0, 1).str("k").u32(vt::BOOL).u8(2).done());
    assert_eq!(
        e,
        "metadata key #0 ('k') value at offset 37: bool must be 0 or 1, found 2"
    );
    let e = message(
        Raw::new(0, 1)
            .str("k")
            .u32(vt::ARRAY)
            .u32(vt::BOOL)
            .u64(3)
            .bytes(&[1, 0, 7])
            .done(),
    );
    assert!(
        e.contains("value element #2 at offset 51: bool must be 0 or 1, found 7"),
        "{e}"
    );
}

#[test]
fn duplicate_and_empty_keys() {
    let e = message(
        Raw::new(0, 3)
            .kv_u32("a", 1)
            .kv_u32("b", 2)
            .kv_str("a", "x")
            .done(),
    );
    assert_eq!(e, "duplicate metadata key 'a' (entries #0 and #2)");
    let e = message(Raw::new(0, 2).kv_u32("a\nb", 1).kv_u32("a\nb", 1).done());
    assert_eq!(e, "duplicate metadata key 'a\\nb' (entries #0 and #1)");
    let e = message(Raw::new(0, 1).kv_u32("", 1).zeros(8).done());
    assert_eq!(e, "metadata key #0 name at offset 24 is empty");
}

#[test]
fn invalid_utf8() {
    let e = message(Raw::new(0, 1).str_bytes(b"a\xffb").u32(vt::U8).u8(0).done());
    assert_eq!(
        e,
        "metadata key #0 name at offset 32 is not valid UTF-8 (bad byte at position 1 of 3)"
    );
    let e = message(
        Raw::new(0, 1)
            .str("k")
            .u32(vt::STRING)
            .str_bytes(b"\xc3")
            .done(),
    );
    assert_eq!(
        e,
        "metadata key #0 ('k') value at offset 45 is not valid UTF-8 (bad byte at position 0 of 1)"
    );
    let e = message(
        Raw::new(0, 1)
            .str("tok")
            .u32(vt::ARRAY)
            .u32(vt::STRING)
            .u64(2)
            .str("ok")
            .str_bytes(b"\xed\xa0\x80")
            .done(),
    );
    assert!(
        e.starts_with("metadata key #0 ('tok') value element #1 at offset"),
        "{e}"
    );
    assert!(
        e.ends_with("is not valid UTF-8 (bad byte at position 0 of 3)"),
        "{e}"
    );
    let e = message(
        Raw::new(1, 0)
            .str_bytes(b"w\x80")
            .u32(1)
            .u64(4)
            .u32(F32)
            .u64(0)
            .pad(32)
            .zeros(16)
            .done(),
    );
    assert_eq!(
        e,
        "tensor #0 name at offset 32 is not valid UTF-8 (bad byte at position 1 of 2)"
    );
}

#[test]
fn bad_alignment() {
    let with = |r: Raw| r.tensor("t", &[4], F32, 0).pad(64).zeros(16).done();
    for a in [0u32, 3, 48] {
        let e = message(with(Raw::new(1, 1).kv_u32("general.alignment", a)));
        assert_eq!(
            e,
            format!("bad general.alignment: must be a nonzero power of two, found {a}")
        );
    }
    let e = message(with(Raw::new(1, 1).kv(
        "general.alignment",
        vt::U64,
        &32u64.to_le_bytes(),
    )));
    assert_eq!(
        e,
        "bad general.alignment: must be of type u32, found u64 32"
    );
    let e = message(with(Raw::new(1, 1).kv_str("general.alignment", "32")));
    assert_eq!(
        e,
        "bad general.alignment: must be of type u32, found string \"32\""
    );

    // A valid alignment is honoured: offsets must be multiples of it.
    let file = |offset: u64| {
        Raw::new(2, 1)
            .kv_u32("general.alignment", 64)
            .tensor("a", &[4], F32, 0)
            .tensor("b", &[4], F32, offset)
            .pad(64)
            .zeros(128)
            .done()
    };
    let f = GgufFile::from_bytes(file(64)).unwrap();
    assert_eq!((f.alignment(), f.data_offset() % 64), (64, 0));
    let e = message(file(32));
    assert_eq!(
        e,
        "tensor 'b': data offset 32 is not a multiple of the alignment 64"
    );
}

#[test]
fn bad_dimension_counts() {
    for n_dims in [0u32, 5, u32::MAX] {
        let bytes = Raw::new(1, 0).str("t").u32(n_dims).zeros(64).done();
        assert_eq!(
            message(bytes),
            format!("tensor 't': has {n_dims} dimensions, must have 1 to 4")
        );
    }
}

#[test]
fn bad_dims() {
    let e = message(one_tensor(&[4, 0], F32, 0, 16));
    assert_eq!(
        e,
        "tensor 't': dims[1] is 0; empty tensors are not supported"
    );
    let e = message(one_tensor(&[u64::MAX], F32, 0, 16));
    assert_eq!(
        e,
        "tensor 't': dims[0]=18446744073709551615 exceeds the limit of 2^50 elements"
    );
    let e = message(one_tensor(&[1 << 32, 1 << 32], F32, 0, 16));
    assert_eq!(
        e,
        "tensor 't': shape [4294967296, 4294967296] has more than 2^50 elements"
    );
    // 2^100 elements: the product would overflow a u64.
    let e = message(one_tensor(&[1 << 25; 4], F32, 0, 16));
    assert!(e.contains("has more than 2^50 elements"), "{e}");
    let e = message(one_tensor(&[1 << 49, 2], F32, 0, 16));
    assert!(e.contains("extends past the end of the file"), "{e}");
}

#[test]
fn row_length_must_be_whole_blocks() {
    let bytes = Raw::new(1, 0)
        .tensor("blk.0.attn_q.weight", &[33, 2], Q4_1, 0)
        .pad(32)
        .zeros(80)
        .done();
    assert_eq!(
        message(bytes),
        "tensor 'blk.0.attn_q.weight': dims[0]=33 is not a multiple of the Q4_1 block size 32"
    );
}

#[test]
fn unknown_tensor_types() {
    for (id, named) in [(4u32, "Q4_2 (removed from ggml) (id 4)"), (19, "IQ1_S (id 19)"), (40, "NVFP4 (id 40)"), (43, "id 43"), (u32::MAX, "id 4294967295")] {
        let e = expect_err(one_tensor(&[32], id, 0, 128));
        assert!(matches!(e, GgufError::UnsupportedTensorType { .. }));
        assert_eq!(e.to_string(), format!("unsupported tensor type {named} for tensor 't'"));
    }
}

#[test]
fn tensor_offsets() {
    let e = message(one_tensor(&[4], F32, 1, 64));
    assert_eq!(
        e,
        "tensor 't': data offset 1 is not a multiple of the alignment 32"
    );
    let e = expect_err(one_tensor(&[4], F32, 32, 16));
    assert!(matches!(e, GgufError::BadTensor { .. }));
    let e = e.to_string();
    assert!(e.starts_with("tensor 't': data at offset 96 + 32 (16 bytes) extends past the end of the file (112 bytes)"), "{e}");
    // Offsets that overflow when added to the data section's start.
    for offset in [!31u64, 1 << 63] {
        let e = message(one_tensor(&[4], F32, offset, 16));
        assert!(e.contains("extends past the end of the file"), "{e}");
    }
    // A file cut inside the data.
    let e = message(one_tensor(&[4], F32, 0, 15));
    assert!(
        e.contains("extends past the end of the file (111 bytes)"),
        "{e}"
    );
}

fn two_tensors(a: (&str, u64, u64), b: (&str, u64, u64)) -> Vec<u8> {
    Raw::new(2, 0)
        .tensor(a.0, &[a.1], F32, a.2)
        .tensor(b.0, &[b.1], F32, b.2)
        .pad(32)
        .zeros(256)
        .done()
}

#[test]
fn overlapping_and_duplicate_tensors() {
    // Adjacent is fine, in either table order.
    assert!(GgufFile::from_bytes(two_tensors(("a", 8, 0), ("b", 8, 32))).is_ok());
    assert!(GgufFile::from_bytes(two_tensors(("a", 8, 32), ("b", 8, 0))).is_ok());
    let e = expect_err(two_tensors(("a", 16, 0), ("b", 4, 32)));
    assert!(matches!(e, GgufError::TensorOverlap { .. }));
    assert_eq!(
        e.to_string(),
        "tensors 'a' (data bytes 0..64) and 'b' (data bytes 32..48) overlap"
    );
    let e = message(two_tensors(("big", 16, 64), ("same", 4, 64)));
    assert!(e.contains("overlap"), "{e}");
    let e = message(two_tensors(("t", 4, 0), ("t", 4, 32)));
    assert_eq!(e, "duplicate tensor name 't' (tensors #0 and #1)");
}

#[test]
fn tensor_names() {
    let e = message(
        Raw::new(1, 0)
            .str("")
            .u32(1)
            .u64(4)
            .u32(F32)
            .u64(0)
            .pad(32)
            .zeros(16)
            .done(),
    );
    assert_eq!(e, "tensor #0 name at offset 24 is empty");
    let e = message(Raw::new(1, 0).u64(u64::MAX - 1).zeros(40).done());
    assert!(
        e.starts_with("tensor #0 name at offset 24: string length 18446744073709551614 exceeds"),
        "{e}"
    );
    let long = "n".repeat(300);
    let e = message(Raw::new(1, 0).str(&long).u32(7).zeros(40).done());
    assert!(
        e.starts_with(&format!(
            "tensor '{}…' (+204 chars): has 7 dimensions",
            "n".repeat(96)
        )),
        "{e}"
    );
}

#[test]
fn truncated_tensor_table() {
    // The name is long enough that every cut below still passes the tensor-count check.
    let name = "blk.0.ffn_down.weight_xyz";
    let full = Raw::new(1, 0)
        .str(name)
        .u32(2)
        .u64(4)
        .u64(4)
        .u32(F32)
        .u64(0)
        .done();
    let cut = |drop: usize| full[..full.len() - drop].to_vec();
    let entry = format!("tensor #0 ('{name}')");
    expect_msg(
        cut(2),
        &[&format!("{entry} data offset needs 8 bytes"), "only 6 left"],
    );
    expect_msg(cut(10), &[&format!("{entry} type needs 4 bytes")]);
    expect_msg(cut(13), &[&format!("{entry} dims[1] needs 8 bytes")]);
    expect_msg(
        cut(30),
        &[&format!("{entry} dimension count needs 4 bytes")],
    );
}
