//! Write a taller copy of a GGUF model: its layers repeated `FACTOR` times (layer `i` of
//! the copy is layer `i mod n` of the original). For experiments that need a model of a
//! known shape and several times the size, such as a ring under memory limits; its text
//! is nonsense.
//!
//! `cargo run --release -p blink-gguf --example tall_model -- IN.gguf OUT.gguf FACTOR`

use blink_gguf::{GgufFile, GgufWriter, Value};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, input, output, factor] = args.as_slice() else {
        return Err("usage: tall_model IN.gguf OUT.gguf FACTOR".into());
    };
    let factor: usize = factor.parse().map_err(|_| format!("FACTOR must be a whole number, not {factor}"))?;
    let file = GgufFile::open(input)?;
    let arch = file.get_str("general.architecture")?.to_string();
    let key = format!("{arch}.block_count");
    let n = file.get_u32(&key)? as usize;
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        if k == "general.alignment" {
            continue;
        }
        let v = if *k == key { Value::U32((n * factor) as u32) } else { v.clone() };
        w.add(k.clone(), v)?;
    }
    w.set_alignment(file.alignment() as u32)?;
    let layer_of = |name: &str| name.strip_prefix("blk.")?.split_once('.').and_then(|(l, rest)| Some((l.parse::<usize>().ok()?, rest.to_string())));
    // Tensors before the layers, the layers in order, then the rest: each layer's
    // tensors lie together, as a converter writes them.
    let is_layer = |name: &str| layer_of(name).is_some();
    let first = file.tensors().iter().position(|t| is_layer(&t.name)).unwrap_or(0);
    for t in file.tensors()[..first].iter().filter(|t| !is_layer(&t.name)) {
        w.add_tensor(t.name.clone(), t.ty, &t.dims, file.tensor_data(t))?;
    }
    for layer in 0..n * factor {
        for t in file.tensors().iter().filter(|t| layer_of(&t.name).is_some_and(|(l, _)| l == layer % n)) {
            let rest = layer_of(&t.name).expect("a layer tensor").1;
            w.add_tensor(format!("blk.{layer}.{rest}"), t.ty, &t.dims, file.tensor_data(t))?;
        }
    }
    for t in file.tensors()[first..].iter().filter(|t| !is_layer(&t.name)) {
        w.add_tensor(t.name.clone(), t.ty, &t.dims, file.tensor_data(t))?;
    }
    w.write(output)?;
    eprintln!("{output}: {} layers ({n} × {factor})", n * factor);
    Ok(())
}
