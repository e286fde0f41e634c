//! Prints a GGUF file's header, metadata and tensor table.
//!
//! Usage: `cargo run -p blink-gguf --example gguf_dump -- MODEL.gguf`

use std::process::ExitCode;
use std::time::Instant;

use blink_gguf::GgufFile;

fn main() -> ExitCode {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: gguf_dump FILE.gguf");
        return ExitCode::from(2);
    };
    let start = Instant::now();
    let file = match GgufFile::open(&path) {
        Ok(file) => file,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let elapsed = start.elapsed();
    println!(
        "GGUF v{}, {} bytes, {} metadata entries, {} tensors, alignment {}, data at {} (opened in {elapsed:.2?})",
        file.version(),
        file.file_size(),
        file.metadata().len(),
        file.tensors().len(),
        file.alignment(),
        file.data_offset(),
    );
    for (key, value) in file.metadata() {
        println!("  {key}: {} = {value}", value.type_name());
    }
    for t in file.tensors() {
        println!("  {t} @ {} ({} bytes)", t.offset, t.n_bytes);
    }
    ExitCode::SUCCESS
}
