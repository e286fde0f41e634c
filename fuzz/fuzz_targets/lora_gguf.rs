//! Fuzzes the llama.cpp LoRA GGUF reader against the default model's configuration: any
//! file must give an adapter whose every pair has its stated shape, or an error; never a
//! panic.

#![no_main]

#[path = "lora_common.rs"]
mod lora_common;

use blink_model::lora::read;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("blink-fuzz-lora-{}.gguf", std::process::id()));
    std::fs::write(&path, data).expect("a temporary file");
    if let Ok(t) = read(&path, lora_common::cfg()) {
        lora_common::check_shapes(&t);
    }
});
