//! Writer → reader round trips, the typed getters, and the writer's own validation.

mod common;

use blink_gguf::{Array, GgmlType, GgufError, GgufFile, GgufWriter, Value};
use common::{expect_msg, filler, sample_file, sample_writer, touch_everything};

fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("v.u8", Value::U8(250)),
        ("v.i8", Value::I8(-3)),
        ("v.u16", Value::U16(65000)),
        ("v.i16", Value::I16(-30000)),
        ("v.u32", Value::U32(4_000_000_000)),
        ("v.i32", Value::I32(-7)),
        ("v.u64", Value::U64(u64::MAX)),
        ("v.i64", Value::I64(i64::MIN)),
        ("v.f32", Value::F32(1.5e-5)),
        ("v.f64", Value::F64(-2.25)),
        ("v.bool", Value::Bool(false)),
        ("v.string", Value::from("ünïcødé ✓ \n with newline")),
        ("v.empty_string", Value::from("")),
        ("a.u8", vec![0u8, 255].into()),
        ("a.i8", vec![-128i8, 127].into()),
        ("a.u16", vec![1u16, 2].into()),
        ("a.i16", vec![-1i16].into()),
        ("a.u32", vec![7u32; 20].into()),
        ("a.i32", vec![i32::MIN, i32::MAX].into()),
        ("a.u64", vec![u64::MAX].into()),
        ("a.i64", vec![-1i64, 1].into()),
        ("a.f32", vec![0.5f32, -0.25].into()),
        ("a.f64", vec![1e300f64].into()),
        ("a.bool", vec![true, false, true].into()),
        (
            "a.string",
            vec!["a".to_string(), String::new(), "ç".to_string()].into(),
        ),
        ("a.empty", Value::Array(Array::I32(vec![]))),
        (
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::Array(vec![Array::F32(vec![1.0])])]),
                Array::U8(vec![]),
            ])),
        ),
    ]
}

#[test]
fn round_trip_preserves_metadata_and_tensors() {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.add(k, v).unwrap();
    }
    let tensors: Vec<(&str, GgmlType, Vec<u64>)> = vec![
        ("t.f32", GgmlType::F32, vec![3, 5]),
        ("t.f16", GgmlType::F16, vec![7]),
        ("t.q4_1", GgmlType::Q4_1, vec![64, 2, 3]),
        ("t.q8_0", GgmlType::Q8_0, vec![32, 1, 1, 2]),
        ("t.q4_k", GgmlType::Q4_K, vec![256]),
        ("t.bf16", GgmlType::BF16, vec![1]),
    ];
    let mut datas = Vec::new();
    for (i, (name, ty, dims)) in tensors.iter().enumerate() {
        let n = blink_gguf::GgmlType::row_bytes(*ty, dims[0]).unwrap() as usize
            * dims[1..].iter().product::<u64>() as usize;
        let data = filler(n, i as u64 + 10);
        w.add_tensor(*name, *ty, dims, &data).unwrap();
        datas.push(data);
    }
    let bytes = w.to_bytes();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();

    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.file_size(), bytes.len() as u64);
    assert_eq!(f.data_offset() % 32, 0);
    let expected: Vec<(String, Value)> = every_value()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(f.metadata(), expected.as_slice());
    for (k, v) in &expected {
        assert_eq!(f.get(k), Some(v), "{k}");
    }
    assert_eq!(f.get("v.missing"), None);

    assert_eq!(f.tensors().len(), tensors.len());
    for ((name, ty, dims), data) in tensors.iter().zip(&datas) {
        let t = f.tensor(name).unwrap();
        assert_eq!((&t.name[..], t.ty, &t.dims), (*name, *ty, dims));
        assert_eq!(t.offset % 32, 0);
        assert_eq!(t.n_bytes, data.len() as u64);
        assert_eq!(f.tensor_data(t), data.as_slice());
    }
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, tensors.iter().map(|t| t.0).collect::<Vec<_>>());
    touch_everything(&f);
}

#[test]
fn files_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<GgufFile>();
    assert_send_sync::<GgufError>();
}

#[test]
fn tensor_shape_helpers() {
    let f = GgufFile::from_bytes(sample_file()).unwrap();
    let c = f.tensor("c").unwrap();
    assert_eq!(
        (c.n_elements(), c.row_len(), c.n_rows(), c.n_bytes),
        (64, 32, 2, 40)
    );
    assert!(f.tensor("nope").is_none());
}

#[test]
fn custom_alignment_round_trips() {
    for alignment in [1u32, 8, 64, 4096] {
        let mut w = sample_writer();
        w.set_alignment(alignment).unwrap();
        assert_eq!(w.alignment(), u64::from(alignment));
        let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(f.alignment(), u64::from(alignment));
        assert_eq!(f.get_u32("general.alignment").unwrap(), alignment);
        assert_eq!(f.data_offset() % u64::from(alignment), 0);
        for t in f.tensors() {
            assert_eq!(t.offset % u64::from(alignment), 0);
        }
        touch_everything(&f);
    }
}

#[test]
fn file_write_and_open_match_in_memory_bytes() {
    let dir = std::env::temp_dir().join(format!("blink-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sample.gguf");
    let w = sample_writer();
    w.write(&path).unwrap();
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(on_disk, w.to_bytes());
    let mut streamed = Vec::new();
    w.write_to(&mut streamed).unwrap();
    assert_eq!(streamed, on_disk);

    let f = GgufFile::open(&path).unwrap();
    let g = GgufFile::from_bytes(on_disk).unwrap();
    assert_eq!(f.metadata(), g.metadata());
    assert_eq!(f.tensors(), g.tensors());
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t), g.tensor_data(t));
    }

    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let e = GgufFile::open(&empty).unwrap_err().to_string();
    assert_eq!(
        e,
        "truncated file: header magic needs 4 bytes at offset 0, only 0 left"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn io_errors_name_the_path() {
    let e = GgufFile::open("/nonexistent/dir/model.gguf").unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }));
    let msg = e.to_string();
    assert!(
        msg.starts_with("cannot open /nonexistent/dir/model.gguf: "),
        "{msg}"
    );
    let e = sample_writer()
        .write("/nonexistent/dir/out.gguf")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("cannot create /nonexistent/dir/out.gguf: "),
        "{e}"
    );
}

#[test]
fn version_2_files_are_read() {
    let mut bytes = sample_file();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.version(), 2);
    touch_everything(&f);
}

#[test]
fn metadata_only_file() {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert!(f.tensors().is_empty());
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    let f = GgufFile::from_bytes(GgufWriter::new().to_bytes()).unwrap();
    assert!(f.metadata().is_empty());
}

#[test]
fn typed_getters_convert_compatible_values() {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.add(k, v).unwrap();
    }
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.get_u32("v.u8").unwrap(), 250);
    assert_eq!(f.get_u32("v.u16").unwrap(), 65000);
    assert_eq!(f.get_u32("v.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_u64("v.u64").unwrap(), u64::MAX);
    assert_eq!(f.get_u64("v.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_f32("v.f32").unwrap(), 1.5e-5);
    assert_eq!(f.get_f32("v.f64").unwrap(), -2.25);
    assert!(!f.get_bool("v.bool").unwrap());
    assert_eq!(f.get_str("v.empty_string").unwrap(), "");
    assert_eq!(
        f.get_array("a.string").unwrap().as_strings().unwrap()[2],
        "ç"
    );
    assert_eq!(
        f.get_array("a.i32").unwrap().as_i32().unwrap(),
        &[i32::MIN, i32::MAX]
    );

    assert_eq!(f.opt_u32("v.u8").unwrap(), Some(250));
    assert_eq!(f.opt_u32("absent").unwrap(), None);
    assert_eq!(f.opt_u64("absent").unwrap(), None);
    assert_eq!(f.opt_f32("v.f32").unwrap(), Some(1.5e-5));
    assert_eq!(f.opt_bool("absent").unwrap(), None);
    assert_eq!(
        f.opt_str("v.string").unwrap(),
        Some("ünïcødé ✓ \n with newline")
    );
    assert_eq!(f.opt_array("a.bool").unwrap().map(Array::len), Some(3));
}

#[test]
fn typed_getters_reject_incompatible_values() {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.add(k, v).unwrap();
    }
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let msg = |e: GgufError| e.to_string();
    assert_eq!(
        msg(f.get_u32("absent").unwrap_err()),
        "missing metadata key 'absent'"
    );
    assert_eq!(
        msg(f.get_u32("v.i32").unwrap_err()),
        "metadata key 'v.i32': expected an integer in u32 range, found i32 -7"
    );
    assert_eq!(
        msg(f.get_u32("v.u64").unwrap_err()),
        "metadata key 'v.u64': expected an integer in u32 range, found u64 18446744073709551615"
    );
    assert!(matches!(
        f.get_u64("v.i64"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(
        f.get_f32("v.u32"),
        Err(GgufError::WrongType {
            expected: "a float",
            ..
        })
    ));
    assert!(matches!(
        f.get_bool("v.u8"),
        Err(GgufError::WrongType { .. })
    ));
    let e = msg(f.get_str("a.string").unwrap_err());
    assert_eq!(
        e,
        "metadata key 'a.string': expected a string, found array[string] [\"a\", \"\", \"ç\"]"
    );
    assert!(matches!(
        f.get_array("v.string"),
        Err(GgufError::WrongType { .. })
    ));
    let e = msg(f.opt_u32("v.string").unwrap_err());
    assert!(
        e.contains("found string \"ünïcødé ✓ \\n with newline\""),
        "{e}"
    );
    assert!(!e.contains('\n'));
    assert!(f.opt_f32("v.bool").is_err());
    assert!(f.opt_bool("v.f32").is_err());
    assert!(f.opt_str("v.u8").is_err());
    assert!(f.opt_array("v.u8").is_err());
    assert!(f.opt_u64("v.i8").is_err());
}

#[test]
fn writer_set_replaces_in_place() {
    let mut w = sample_writer();
    w.set("llama.block_count", 30u32).unwrap();
    w.set("new.key", "v").unwrap();
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(
        f.metadata()[1],
        ("llama.block_count".to_string(), Value::U32(30))
    );
    assert_eq!(f.metadata().last().unwrap().0, "new.key");
}

#[test]
fn writer_rejects_what_the_reader_would() {
    let mut w = sample_writer();
    let e = w.add("llama.block_count", 1u32).unwrap_err().to_string();
    assert_eq!(
        e,
        "duplicate metadata key 'llama.block_count' (entries #1 and #7)"
    );
    let e = w.add("", 1u32).unwrap_err().to_string();
    assert_eq!(e, "cannot write metadata key '': the key is empty");
    assert!(w.add("k".repeat(70_000), 1u8).is_err());
    let deep = Array::Array(vec![Array::Array(vec![Array::Array(vec![Array::Array(
        vec![Array::U8(vec![])],
    )])])]);
    let e = w.add("deep", deep).unwrap_err().to_string();
    assert!(e.contains("nested more than 4 levels"), "{e}");

    let e = w.set_alignment(3).unwrap_err().to_string();
    assert_eq!(
        e,
        "bad general.alignment: must be a nonzero power of two, found 3"
    );
    assert!(w.set_alignment(0).is_err());
    let e = w.add("general.alignment", 32u64).unwrap_err().to_string();
    assert_eq!(e, "bad general.alignment: must be of type u32, found u64");
    assert_eq!(w.alignment(), 32);

    let e = w
        .add_tensor("a", GgmlType::F32, &[1], &[0; 4])
        .unwrap_err()
        .to_string();
    assert_eq!(e, "duplicate tensor name 'a' (tensors #0 and #3)");
    let e = w
        .add_tensor("x", GgmlType::F32, &[2, 2], &[0; 15])
        .unwrap_err()
        .to_string();
    assert_eq!(e, "tensor 'x': data is 15 bytes, but F32 [2, 2] needs 16");
    let e = w
        .add_tensor("x", GgmlType::Q4_1, &[33], &[0; 20])
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "tensor 'x': dims[0]=33 is not a multiple of the Q4_1 block size 32"
    );
    assert!(w.add_tensor("x", GgmlType::F32, &[], &[]).is_err());
    assert!(w
        .add_tensor("x", GgmlType::F32, &[1, 1, 1, 1, 1], &[0; 4])
        .is_err());
    assert!(w.add_tensor("", GgmlType::F32, &[1], &[0; 4]).is_err());
    // The failed calls left the writer as it was.
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(f.metadata().len(), 7);
}

#[test]
fn display_renders_values_briefly() {
    let f = GgufFile::from_bytes(sample_file()).unwrap();
    let shown: Vec<String> = f.metadata().iter().map(|(_, v)| v.to_string()).collect();
    assert_eq!(
        shown,
        [
            "\"llama\"",
            "2",
            "10000",
            "true",
            "[\"<s>\", \"héllo\"]",
            "[1, -2]",
            "[[1, 2]]"
        ]
    );
}

#[test]
fn tensor_data_of_a_foreign_tensor_is_empty_not_a_panic() {
    let f = GgufFile::from_bytes(sample_file()).unwrap();
    let mut t = f.tensors()[0].clone();
    t.offset = u64::MAX - 3;
    assert!(f.tensor_data(&t).is_empty());
    t.offset = 0;
    t.n_bytes = 1 << 40;
    assert!(f.tensor_data(&t).is_empty());
}

#[test]
fn hand_built_corruption_of_writer_output_is_caught() {
    // Start from a valid file and bump tensor "b"'s declared type from Q8_0 to Q4_1.
    let bytes = sample_file();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let needle = [
        b"b".as_slice(),
        &1u32.to_le_bytes(),
        &32u64.to_le_bytes(),
        &8u32.to_le_bytes(),
    ]
    .concat();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap();
    let mut bad = bytes.clone();
    let type_at = at + needle.len() - 4;
    bad[type_at..type_at + 4].copy_from_slice(&3u32.to_le_bytes());
    // Q4_1 [32] is 20 bytes instead of 34: still valid, just different.
    let g = GgufFile::from_bytes(bad).unwrap();
    assert_eq!(g.tensor("b").unwrap().n_bytes, 20);
    assert_eq!(f.tensor("b").unwrap().n_bytes, 34);
    // Type id 4 was removed from ggml.
    let mut bad = bytes;
    bad[type_at..type_at + 4].copy_from_slice(&4u32.to_le_bytes());
    expect_msg(bad, &["unsupported tensor type Q4_2 (removed from ggml) (id 4) for tensor 'b'"]);
}

#[test]
fn declared_tensors_stream_the_same_bytes() {
    let data = |n: usize, seed: u8| (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>();
    let tensors: [(&str, GgmlType, Vec<u64>); 3] = [("a", GgmlType::F32, vec![3, 5]), ("b", GgmlType::Q4_0, vec![64, 3]), ("c", GgmlType::F16, vec![7])];
    let (mut held, mut declared) = (GgufWriter::new(), GgufWriter::new());
    for w in [&mut held, &mut declared] {
        w.add("general.architecture", "test").unwrap();
    }
    let mut bytes = Vec::new();
    for (i, (name, ty, dims)) in tensors.iter().enumerate() {
        let n = declared.declare_tensor(*name, *ty, dims).unwrap() as usize;
        bytes.push(data(n, i as u8));
        held.add_tensor(*name, *ty, dims, &bytes[i]).unwrap();
    }
    assert_eq!(declared.declare_tensor("a", GgmlType::F32, &[1]).unwrap_err().to_string(), held.add_tensor("a", GgmlType::F32, &[1], &[0; 4]).unwrap_err().to_string());
    let mut asked = Vec::new();
    let mut out = Vec::new();
    declared
        .write_to_with(&mut out, |name, w| {
            asked.push(name.to_string());
            let i = tensors.iter().position(|t| t.0 == name).unwrap();
            // In two pieces, as a chunked producer writes.
            let (x, y) = bytes[i].split_at(bytes[i].len() / 2);
            w.write_all(x)?;
            w.write_all(y)
        })
        .unwrap();
    assert_eq!(asked, ["a", "b", "c"]);
    assert_eq!(out, held.to_bytes());
    GgufFile::from_bytes(out).unwrap();

    // A declared tensor given too few bytes, or none, fails.
    let short = declared.write_to_with(&mut Vec::new(), |_, w| w.write_all(&[0; 4])).unwrap_err();
    assert!(short.to_string().contains("tensor 'a' was given 4 bytes, but needs 60"), "{short}");
    let none = declared.write_to(&mut Vec::new()).unwrap_err();
    assert!(none.to_string().contains("declared without its data"), "{none}");
}
