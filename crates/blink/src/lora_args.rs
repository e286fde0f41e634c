//! The adapter options of `run`, `chat`, `perplexity` and `bench`, as llama.cpp spells
//! them: `--lora PATH` (repeatable) and `--lora-scaled PATH SCALE`.

use std::path::PathBuf;
use std::sync::Arc;

use blink_model::lora::LoraMix;
use blink_model::Model;
use clap::Args;

use crate::common::CliResult;

/// LoRA adapters to apply (stacked when several are given).
#[derive(Args, Clone, Debug, Default)]
pub struct LoraArgs {
    /// A LoRA adapter (a PEFT directory or a llama.cpp LoRA GGUF), at scale 1; repeatable.
    #[arg(long = "lora", value_name = "PATH")]
    pub lora: Vec<PathBuf>,
    /// A LoRA adapter at SCALE; repeatable.
    #[arg(long = "lora-scaled", num_args = 2, value_names = ["PATH", "SCALE"], allow_hyphen_values = true)]
    pub lora_scaled: Vec<String>,
}

/// `--lora-scaled`'s values, read in pairs: a path and a finite scale.
pub fn parse_scaled(values: &[String]) -> CliResult<Vec<(PathBuf, f32)>> {
    values
        .chunks(2)
        .map(|pair| {
            let [path, scale] = pair else { return Err("--lora-scaled takes a path and a scale".into()) };
            let value: f32 = scale.parse().map_err(|_| format!("--lora-scaled {path}: the scale '{scale}' is not a number"))?;
            if !value.is_finite() {
                return Err(format!("--lora-scaled {path}: the scale must be finite, not {scale}").into());
            }
            Ok((PathBuf::from(path), value))
        })
        .collect()
}

impl LoraArgs {
    /// The adapters and their scales, in the order given (`--lora` first).
    pub fn adapters(&self) -> CliResult<Vec<(PathBuf, f32)>> {
        let mut out: Vec<(PathBuf, f32)> = self.lora.iter().map(|p| (p.clone(), 1.0)).collect();
        out.extend(parse_scaled(&self.lora_scaled)?);
        Ok(out)
    }

    /// Read and place the adapters on `model`; `None` when none were given. Each one is
    /// described on stderr.
    pub fn load(&self, model: &Model) -> CliResult<Option<Arc<LoraMix>>> {
        let wanted = self.adapters()?;
        if wanted.is_empty() {
            return Ok(None);
        }
        let mut mix = Vec::with_capacity(wanted.len());
        for (path, scale) in wanted {
            let adapter = model.load_lora(&path).map_err(|e| format!("--lora {}", e.about(&path)))?;
            eprintln!(
                "blink: adapter {}: rank {}, alpha {}, scale {scale}, {:.1} MB",
                path.display(),
                adapter.max_rank(),
                adapter.alpha(),
                adapter.held_bytes() as f64 / 1e6
            );
            mix.push((Arc::new(adapter), scale));
        }
        Ok(Some(Arc::new(LoraMix::new(mix))))
    }
}
