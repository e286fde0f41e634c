//! What the LoRA fuzz targets share: the default model's configuration to check adapters
//! against, and the invariant every adapter read must keep.

use std::sync::OnceLock;

use blink_model::lora::LoraTensors;
use blink_model::ModelConfig;

pub fn cfg() -> &'static ModelConfig {
    static CFG: OnceLock<ModelConfig> = OnceLock::new();
    CFG.get_or_init(|| {
        let path = blink_model::fetch::ensure_default_model().expect("the default model");
        ModelConfig::from_gguf(&blink_gguf::GgufFile::open(path).expect("the default model opens")).expect("its configuration")
    })
}

/// Every pair's matrices have the sizes its rank and shape say.
pub fn check_shapes(t: &LoraTensors) {
    for pair in t.layers.iter().flatten().flatten() {
        assert_eq!(pair.a.len(), pair.rank * pair.cols);
        assert_eq!(pair.b.len(), pair.rows * pair.rank);
    }
}
