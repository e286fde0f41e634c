//! Writes a few small valid GGUF files to seed the fuzzer's corpus.
//!
//! Usage: `cargo run -p blink-gguf --example fuzz_seeds -- fuzz/corpus/gguf_parse`

use std::path::PathBuf;
use std::process::ExitCode;

use blink_gguf::{Array, GgmlType, GgufError, GgufWriter, Value};

/// Deterministic non-zero filler for tensor data.
fn filler(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 37 + 11) as u8).collect()
}

fn tiny_model() -> Result<GgufWriter, GgufError> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama")?;
    w.add("llama.block_count", 1u32)?;
    w.add("llama.rope.freq_base", 10000.0f32)?;
    w.add("tokenizer.ggml.add_bos_token", true)?;
    w.add(
        "tokenizer.ggml.tokens",
        vec!["<s>".to_string(), "a".to_string(), "ab".to_string()],
    )?;
    w.add("tokenizer.ggml.token_type", vec![3i32, 1, 1])?;
    w.add_tensor("token_embd.weight", GgmlType::Q8_0, &[32, 3], &filler(102))?;
    w.add_tensor("blk.0.attn_norm.weight", GgmlType::F32, &[4], &filler(16))?;
    w.add_tensor("blk.0.attn_q.weight", GgmlType::Q4_1, &[32, 2], &filler(40))?;
    Ok(w)
}

fn every_type() -> Result<GgufWriter, GgufError> {
    let mut w = GgufWriter::new();
    w.set_alignment(8)?;
    w.add("u8", 1u8)?;
    w.add("i8", -1i8)?;
    w.add("u16", 2u16)?;
    w.add("i16", -2i16)?;
    w.add("i32", -3i32)?;
    w.add("u64", 4u64)?;
    w.add("i64", -4i64)?;
    w.add("f64", 0.5f64)?;
    w.add("bools", vec![true, false])?;
    w.add("f32s", vec![1.0f32, -1.0])?;
    w.add(
        "nested",
        Value::Array(Array::Array(vec![
            Array::U16(vec![7]),
            Array::String(vec!["x".into()]),
        ])),
    )?;
    w.add_tensor("h", GgmlType::F16, &[2, 2], &filler(8))?;
    w.add_tensor("k", GgmlType::Q4_K, &[256], &filler(144))?;
    Ok(w)
}

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: fuzz_seeds OUTPUT_DIR");
        return ExitCode::from(2);
    };
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        std::fs::create_dir_all(&dir)?;
        let mut metadata_only = GgufWriter::new();
        metadata_only.add("general.name", "seed")?;
        for (name, w) in [
            ("tiny_model", tiny_model()?),
            ("every_type", every_type()?),
            ("metadata_only", metadata_only),
        ] {
            let path = dir.join(format!("{name}.bin"));
            w.write(&path)?;
            println!("wrote {} ({} bytes)", path.display(), w.to_bytes().len());
        }
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
