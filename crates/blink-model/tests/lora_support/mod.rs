//! What the LoRA file tests share: the golden adapters' places, the default model's
//! configuration and a temporary directory of a test's own.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use blink_gguf::GgufFile;
use blink_model::ModelConfig;

pub const R8: &str = "adapter-r8";
pub const R4: &str = "adapter-r4-qv";
pub const CONFIG: &str = "adapter_config.json";
pub const MODEL: &str = "adapter_model.safetensors";

pub fn golden() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidates: Vec<PathBuf> = std::env::var_os("BLINK_LORA_GOLDEN_DIR")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .into_iter()
        .chain([root.join("testdata/golden/lora")])
        .collect();
    candidates.iter().find(|d| d.join(R8).is_dir()).cloned().unwrap_or_else(|| panic!("no LoRA golden data in any of {candidates:?}"))
}

pub fn peft_dir(name: &str) -> PathBuf {
    golden().join(name)
}

pub fn gguf_file(name: &str) -> PathBuf {
    golden().join("gguf").join(format!("{name}.f32.gguf"))
}

/// The default model's configuration (SmolLM2-135M: 30 layers, 9 heads, 3 KV heads).
pub fn cfg() -> &'static ModelConfig {
    static CFG: OnceLock<ModelConfig> = OnceLock::new();
    CFG.get_or_init(|| {
        let file = GgufFile::open(blink_model::fetch::ensure_default_model().unwrap()).unwrap();
        ModelConfig::from_gguf(&file).unwrap()
    })
}

/// A directory of the test's own, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("blink-lora-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
