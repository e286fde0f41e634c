//! Fuzzes the PEFT adapter reader against the default model's configuration. The input is
//! split into `adapter_config.json` (its first byte gives the length) and
//! `adapter_model.safetensors` (the rest); any pair of files must give an adapter whose every
//! pair has its stated shape, or an error; never a panic.

#![no_main]

#[path = "lora_common.rs"]
mod lora_common;

use blink_model::lora::read;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else { return };
    let (config, model) = rest.split_at((n as usize).min(rest.len()));
    let dir = std::env::temp_dir().join(format!("blink-fuzz-peft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    std::fs::write(dir.join("adapter_config.json"), config).expect("a temporary file");
    std::fs::write(dir.join("adapter_model.safetensors"), model).expect("a temporary file");
    if let Ok(t) = read(&dir, lora_common::cfg()) {
        lora_common::check_shapes(&t);
    }
});
