//! Fuzzes the llama.cpp LoRA GGUF reader against the default model's configuration: any
//! file must give an adapter whose every pair has its stated shape, or an error; never a
//! panic.

#![no_main]

use std::sync::OnceLock;

use blink_model::lora::{read, LoraTensors};
use blink_model::ModelConfig;
use libfuzzer_sys::fuzz_target;

fn cfg() -> &'static ModelConfig {
    static CFG: OnceLock<ModelConfig> = OnceLock::new();
    CFG.get_or_init(|| {
        let path = blink_model::fetch::ensure_default_model().expect("the default model");
        ModelConfig::from_gguf(&blink_gguf::GgufFile::open(path).expect("the default model opens")).expect("its configuration")
    })
}

/// Every pair's matrices have the sizes its rank and shape say.
fn check_shapes(t: &LoraTensors) {
    for pair in t.layers.iter().flatten().flatten() {
        assert_eq!(pair.a.len(), pair.rank * pair.cols);
        assert_eq!(pair.b.len(), pair.rows * pair.rank);
    }
}

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("blink-fuzz-lora-{}.gguf", std::process::id()));
    std::fs::write(&path, data).expect("a temporary file");
    if let Ok(t) = read(&path, cfg()) {
        check_shapes(&t);
    }
});
