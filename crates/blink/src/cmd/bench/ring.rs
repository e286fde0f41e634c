//! `blink bench --cluster cluster.toml`: a ring's speed, with this process as its head.
//!
//! `pp<N>` runs an N-token prompt as one step round the ring. `tg<N>` generates N tokens
//! in each of `--batch` sequences, cut into `--in-flight` micro-batches that go round the
//! ring at once: while one is on a device, the others are on the others, so no device
//! waits for one token's trip. Each test is repeated `-r` times after one warm-up.

use std::collections::HashMap;
use std::time::Instant;

use blink_cluster::head::RingHead;
use blink_engine::sampling::argmax;
use blink_engine::Steps;
use blink_model::kv_cache::{KvCache, BLOCK_TOKENS};
use blink_model::{SeqId, StepRow};

use super::{mean_sd, random_ids, repeat_each, Args};
use crate::cmd::cluster::{self, HeadSizes};
use crate::common::{resolve_threads, CliResult};

pub fn main(args: &Args) -> CliResult {
    args.kernel.apply()?;
    let path = args.ring.cluster.as_ref().expect("called with --cluster");
    let threads = match args.threads.as_slice() {
        [] => resolve_threads(None)?,
        [t] => resolve_threads(Some(*t))?,
        _ => return Err("with --cluster, give one thread count (-t) for the head".into()),
    };
    if args.depth.iter().any(|&d| d > 0) || args.lora > 0 || args.bandwidth {
        return Err("with --cluster, -d, --lora and --bandwidth are not measured yet".into());
    }
    let batch = args.batch.iter().copied().max().unwrap_or(1).max(1);
    let n_prompt = args.n_prompt.iter().copied().max().unwrap_or(0);
    let n_gen = args.n_gen.iter().copied().max().unwrap_or(0);
    // Room for the prompt test's sequence and every generation test's, whole blocks each.
    let blocks = |t: usize| KvCache::blocks_for(t) * BLOCK_TOKENS;
    let kv_tokens = blocks(n_prompt) + batch * blocks(n_gen + 1);
    let sizes = HeadSizes { threads, ctx: Some((n_prompt.max(n_gen) + 1).max(64)), n_batch: n_prompt.max(batch), n_logits: batch, kv_tokens: Some(kv_tokens), kv_type: args.cache_type };
    let mut head = cluster::start(path, &args.ring.shim, &args.model, &sizes)?;
    let vocab = head.tokenizer.vocab_size();
    let reps = args.reps.max(1);
    outln!("blink bench: ring head, {threads} thread(s), {reps} repetitions")?;
    outln!("| test | in-flight | batch | tok/s |")?;
    outln!("| --- | ---: | ---: | ---: |")?;
    for &p in args.n_prompt.iter().filter(|&&p| p > 0) {
        let seq = head.ring.new_seq(p)?;
        let tokens = random_ids(vocab, p, 1);
        let samples = repeat_each(reps, 1, |_| prompt_speed(&mut head.ring, seq, &tokens))?.remove(0);
        let (mean, sd) = mean_sd(&samples);
        outln!("| pp{p} | 1 | 1 | {mean:.2} ± {sd:.2} |")?;
        head.ring.release(seq);
    }
    for &n in args.n_gen.iter().filter(|&&n| n > 0) {
        for &b in args.batch.iter().filter(|&&b| b > 0) {
            for &f in args.in_flight.iter().filter(|&&f| f > 0) {
                let f = f.min(b);
                let seqs = (0..b).map(|_| head.ring.new_seq(n + 1)).collect::<Result<Vec<_>, _>>()?;
                let samples = repeat_each(reps, 1, |_| gen_speed(&mut head.ring, &seqs, n, f, vocab))?.remove(0);
                let (mean, sd) = mean_sd(&samples);
                outln!("| tg{n} | {f} | {b} | {mean:.2} ± {sd:.2} |")?;
                for s in seqs {
                    head.ring.release(s);
                }
            }
        }
    }
    Ok(())
}

fn prompt_speed(ring: &mut RingHead, seq: SeqId, tokens: &[u32]) -> CliResult<f64> {
    ring.truncate(seq, 0)?;
    let n = tokens.len();
    let rows: Vec<StepRow> = tokens.iter().enumerate().map(|(i, &t)| StepRow::prompt(t, i, seq).with_logits(i + 1 == n)).collect();
    let start = Instant::now();
    ring.run_with(&rows, &[])?;
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// Aggregate tokens per second generating `n` tokens in every sequence, `in_flight`
/// micro-batches of them going round at once (each submitted again as soon as it is back).
fn gen_speed(ring: &mut RingHead, seqs: &[SeqId], n: usize, in_flight: usize, vocab: usize) -> CliResult<f64> {
    for &s in seqs {
        ring.truncate(s, 0)?;
    }
    // Micro-batch g holds sequences g, g + in_flight, ...
    let groups: Vec<Vec<SeqId>> = (0..in_flight).map(|g| seqs.iter().copied().skip(g).step_by(in_flight).collect()).collect();
    let mut tokens: Vec<Vec<u32>> = groups.iter().enumerate().map(|(g, s)| random_ids(vocab, s.len(), 2 + g as u64)).collect();
    let mut done = vec![0usize; in_flight];
    let mut group_of: HashMap<u64, usize> = HashMap::new();
    let rows = |g: usize, pos: usize, tokens: &[u32]| -> Vec<StepRow> { groups[g].iter().zip(tokens).map(|(&s, &t)| StepRow::decode(t, pos, s)).collect() };
    let start = Instant::now();
    for (g, first) in tokens.iter().enumerate().take(in_flight) {
        let id = ring.submit(&rows(g, 0, first), &[])?;
        group_of.insert(id, g);
    }
    while ring.in_flight() > 0 {
        let id = ring.wait()?;
        let g = group_of.remove(&id).expect("a step this test submitted");
        for (i, t) in tokens[g].iter_mut().enumerate() {
            *t = argmax(ring.logits_mut(i));
        }
        done[g] += 1;
        if done[g] < n {
            let id = ring.submit(&rows(g, done[g], &tokens[g]), &[])?;
            group_of.insert(id, g);
        }
    }
    Ok((n * seqs.len()) as f64 / start.elapsed().as_secs_f64())
}
