//! Fuzzes the PEFT adapter reader against the default model's configuration. The input is
//! split into `adapter_config.json` (its first byte gives the length) and
//! `adapter_model.safetensors` (the rest); any pair of files must give an adapter whose every
//! pair has its stated shape, or an error; never a panic.

#![no_main]

use std::sync::OnceLock;

use blink_model::lora::read;
use blink_model::ModelConfig;
use libfuzzer_sys::fuzz_target;

fn cfg() -> &'static ModelConfig {
    static CFG: OnceLock<ModelConfig> = OnceLock::new();
    CFG.get_or_init(|| {
        let path = blink_model::fetch::ensure_default_model().expect("the default model");
        ModelConfig::from_gguf(&blink_gguf::GgufFile::open(path).expect("the default model opens")).expect("its configuration")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else { return };
    let (config, model) = rest.split_at((n as usize).min(rest.len()));
    let dir = std::env::temp_dir().join(format!("blink-fuzz-peft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    std::fs::write(dir.join("adapter_config.json"), config).expect("a temporary file");
    std::fs::write(dir.join("adapter_model.safetensors"), model).expect("a temporary file");
    if let Ok(t) = read(&dir, cfg()) {
        for pair in t.layers.iter().flatten().flatten() {
            assert_eq!(pair.a.len(), pair.rank * pair.cols);
            assert_eq!(pair.b.len(), pair.rows * pair.rank);
        }
    }
});
