//! Dev tool: greedy ids for a list of prompt ids (no tokenizer), to compare with llama.cpp.
use blink_model::{KvType, Model, Scratch, StepRow};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = Model::load(&args[1]).unwrap();
    let prompt: Vec<u32> = args[2].split(',').map(|s| s.trim().parse().unwrap()).collect();
    let n: usize = args.get(3).map_or(32, |s| s.parse().unwrap());
    let pool = model.pool(2).unwrap();
    let mut kv = model.new_kv_cache(512, KvType::F16);
    let seq = kv.new_seq();
    let mut scratch = Scratch::new(&model, 64, 1, 512, 2);
    let rows: Vec<StepRow> = prompt.iter().enumerate().map(|(i, &t)| StepRow::prompt(t, i, seq).with_logits(i + 1 == prompt.len())).collect();
    let t0 = std::time::Instant::now();
    model.forward(&pool, &mut kv, &rows, &mut scratch).unwrap();
    let t_prompt = t0.elapsed();
    if let Ok(path) = std::env::var("DUMP") {
        let bytes: Vec<u8> = scratch.logits(0).iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).unwrap();
    }
    let mut out = Vec::new();
    let t1 = std::time::Instant::now();
    for i in 0..n {
        let l = scratch.logits(0);
        let mut best = 0;
        for (j, &v) in l.iter().enumerate() { if v > l[best] { best = j; } }
        out.push(best as u32);
        let row = StepRow::decode(best as u32, prompt.len() + i, seq);
        model.forward(&pool, &mut kv, &[row], &mut scratch).unwrap();
    }
    eprintln!("prompt {:?}, gen {:.1} tok/s", t_prompt, n as f64 / t1.elapsed().as_secs_f64());
    println!("{:?}", out);
}
