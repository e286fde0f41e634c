//! One AdamW step on the reference adapter and gradients (shared/golden/lora), against what
//! `torch.optim.AdamW(lr=1e-3, weight_decay=0)` did with them: the largest element update.

use std::path::PathBuf;

use blink_train::optim::{AdamW, AdamWConfig};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/lora")
}

/// Every tensor of a safetensors file of f32 tensors, by name.
fn read_f32(bytes: &[u8]) -> Vec<(String, Vec<f32>)> {
    let st = SafeTensors::deserialize(bytes).expect("safetensors");
    let mut out: Vec<(String, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), Dtype::F32, "{name}");
            let data = view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            (name, data)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn one_step_on_the_reference_gradients_moves_as_torch_did() {
    let g: Value = serde_json::from_str(&std::fs::read_to_string(golden().join("grads.json")).unwrap()).unwrap();
    let want = g["adamw_step"]["max_abs_param_update"].as_f64().unwrap();
    let params = read_f32(&std::fs::read(golden().join("adapter-r8/adapter_model.safetensors")).unwrap());
    let grads = read_f32(&std::fs::read(golden().join("grads-r8.safetensors")).unwrap());
    assert_eq!(params.len(), 420);
    assert!(params.iter().zip(&grads).all(|(p, g)| p.0 == g.0 && p.1.len() == g.1.len()));

    let sizes: Vec<usize> = params.iter().map(|p| p.1.len()).collect();
    let before: Vec<Vec<f32>> = params.iter().map(|p| p.1.clone()).collect();
    let mut after = before.clone();
    let grads: Vec<&[f32]> = grads.iter().map(|g| g.1.as_slice()).collect();
    let mut opt = AdamW::new(AdamWConfig::new(1e-3, 0.0), &sizes).unwrap();
    opt.step(&mut after, &grads).unwrap();

    let mut max = 0f64;
    for ((b, a), g) in before.iter().zip(&after).zip(&grads) {
        for ((&b, &a), &g) in b.iter().zip(a).zip(*g) {
            let d = f64::from(a) - f64::from(b);
            max = max.max(d.abs());
            // Bias-corrected step 1: every element with a gradient well above eps moves by
            // about lr against it (f32 rounding of the parameter aside).
            if g.abs() > 1e-4 {
                assert!((d + 1e-3 * f64::from(g.signum())).abs() < 1e-3 * 1e-2, "g {g}: moved {d}");
            }
        }
    }
    // The same f32 arithmetic gives torch's value exactly.
    assert_eq!(max, want, "largest update {max}, torch's {want}");
}
