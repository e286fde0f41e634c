//! The decode hot path allocates nothing in steady state: a forward step and sampling,
//! repeated, make no heap allocation (checked with a counting global allocator).

use blink_engine::{Sampler, SamplingParams};
use blink_model::{KvType, Model, Scratch, StepRow};
use blink_runtime::alloc_count::{count_allocations, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[test]
fn decode_steps_and_sampling_do_not_allocate() {
    let path = blink_model::fetch::ensure_default_model().unwrap();
    let model = Model::load(&path).unwrap();
    let pool = model.pool(2).unwrap();
    let batch = 4;
    let mut kv = model.new_kv_cache(batch * 128, KvType::F16);
    // As the serving engine does at admission, reserve each sequence's blocks up front.
    let seqs: Vec<usize> = (0..batch)
        .map(|_| {
            let s = kv.new_seq();
            kv.reserve(s, 128).unwrap();
            s
        })
        .collect();
    let mut scratch = Scratch::new(&model, batch, batch, 128, 2);
    let mut samplers: Vec<Sampler> = (0..batch)
        .map(|i| {
            let params = SamplingParams { seed: Some(i as u64), repeat_penalty: 1.1, ..Default::default() };
            Sampler::new(params)
        })
        .collect();
    let mut tokens: Vec<u32> = vec![504, 3575, 282, 4649];
    let mut rows: Vec<StepRow> = Vec::with_capacity(batch);
    let mut step = |pos: usize, kv: &mut blink_model::KvCache, scratch: &mut Scratch, tokens: &mut Vec<u32>, samplers: &mut Vec<Sampler>| {
        rows.clear();
        rows.extend(seqs.iter().zip(tokens.iter()).map(|(&seq, &token)| StepRow::decode(token, pos, seq)));
        model.forward(&pool, kv, &rows, scratch).unwrap();
        for (i, t) in tokens.iter_mut().enumerate() {
            *t = samplers[i].sample(scratch.logits_mut(i));
            samplers[i].accept(*t);
        }
    };
    // Warm up: the first steps size every buffer (sampler candidates, penalty window).
    for pos in 0..8 {
        step(pos, &mut kv, &mut scratch, &mut tokens, &mut samplers);
    }
    let ((), counted) = count_allocations(|| {
        for pos in 8..72 {
            step(pos, &mut kv, &mut scratch, &mut tokens, &mut samplers);
        }
    });
    assert_eq!(counted.allocs, 0, "the decode hot path allocated {} times, the first {} bytes", counted.allocs, counted.first_size);
}
