//! A warm ring allocates nothing per hop: with two nodes and the head in this process,
//! steps of two micro-batches in flight (one on the base model, one on a LoRA adapter)
//! go round — the head's embedding and exit, each frame written, read, decoded, run on a
//! node's window and passed on — without a heap allocation on any thread. Checked with a
//! counting global allocator, which counts every thread: this file holds one test, so
//! nothing else runs beside it.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blink_cluster::auth::{file_sha256, Token};
use blink_cluster::head::{RingHead, RingSpec};
use blink_cluster::link::Shim;
use blink_cluster::node::{self, NodeOptions};
use blink_cluster::placement::Ring;
use blink_cluster::wire::MAX_PAYLOAD;
use blink_engine::RunnerConfig;
use blink_gguf::GgufFile;
use blink_model::lora::LoraMix;
use blink_model::{AdapterSlot, KvType, Matrices, Model, Share, StepRow, TensorPlacement};
use blink_runtime::alloc_count::{count_allocations, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Each row's greedy next token, from the head's logits of the last step.
fn next_tokens(head: &mut RingHead, rows: &mut [StepRow]) {
    use blink_engine::Steps;
    for (i, row) in rows.iter_mut().enumerate() {
        let logits = head.logits_mut(i);
        let best = (0..logits.len()).fold(0, |b, t| if logits[t] > logits[b] { t } else { b });
        (row.token, row.pos) = (Some(best as u32), row.pos + 1);
    }
}

#[test]
fn steps_going_round_a_warm_ring_do_not_allocate() {
    let path = blink_model::fetch::ensure_default_model().expect("the default model");
    let token = Token::new("a ring token for the allocation test, long enough").unwrap();
    let addrs: Vec<String> = (0..2).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    for listen in &addrs {
        let opts = NodeOptions { listen: listen.clone(), token: token.clone(), model: path.clone(), threads: 1, max_frame: MAX_PAYLOAD, shim: Shim::default(), force_prefetch: false };
        std::thread::spawn(move || node::serve(opts).unwrap());
    }
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let model = Arc::new(Model::from_gguf_share(file, &TensorPlacement::flat(1), Share::windows(Vec::new(), Matrices::Repacked)).unwrap());
    let spec = RingSpec {
        ring: Ring::new(vec![12, 18], 1).unwrap(),
        head: None,
        addrs: addrs.clone(),
        threads: vec![1, 1],
        memory: vec![0, 0],
        model_sha256: file_sha256(&path).unwrap(),
        shim: Shim::default(),
        cluster: None,
    };
    let sizes = RunnerConfig { threads: 1, kv_tokens: 1024, kv_type: KvType::F16, max_rows: 8, max_logit_rows: 8, max_ctx: 256, swa_full: false, detached: false };
    // The nodes start listening once they have hashed the model.
    let started = Instant::now();
    let mut head = loop {
        match RingHead::start(model.clone(), spec.clone(), &token, sizes.clone()) {
            Ok(h) => break h,
            Err(e) if started.elapsed() < Duration::from_secs(60) => {
                eprintln!("waiting for the nodes: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("the ring did not start: {e}"),
        }
    };
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/lora/adapter-r8");
    let adapters = [Arc::new(LoraMix::single(Arc::new(model.load_lora(&golden).unwrap())))];
    // Two micro-batches of two sequences, the second on the adapter, each its prompt
    // first.
    let prompt = [1u32, 504, 3458, 28];
    let mut batches: Vec<Vec<StepRow>> = (0..2u32)
        .map(|b| {
            let rows: Vec<StepRow> = (0..2).flat_map(|s| prompt.iter().enumerate().map(move |(p, &t)| StepRow::prompt(t + s + b, p, (2 * b + s) as usize))).collect();
            rows.into_iter().map(|r| StepRow { logits: r.pos == prompt.len() - 1, adapter: (b == 1).then_some(AdapterSlot(0)), ..r }).collect()
        })
        .collect();
    let mix = |b: usize| if b == 1 { &adapters[..] } else { &[][..] };
    for (b, rows) in batches.iter_mut().enumerate() {
        head.submit(rows, mix(b)).unwrap();
        head.wait().unwrap();
        let mut last: Vec<StepRow> = rows.iter().filter(|r| r.logits).map(|r| StepRow { kind: blink_model::RowKind::Decode, ..*r }).collect();
        next_tokens(&mut head, &mut last);
        *rows = last;
    }
    // Both micro-batches in flight at once, each fed its greedy tokens when it lands.
    let mut steps = |n: usize, head: &mut RingHead| {
        for _ in 0..n {
            let ids = [head.submit(&batches[0], mix(0)).unwrap(), head.submit(&batches[1], mix(1)).unwrap()];
            for _ in 0..2 {
                let id = head.wait().unwrap();
                let b = ids.iter().position(|&i| i == id).unwrap();
                next_tokens(head, &mut batches[b]);
            }
        }
    };
    // Warm up: every buffer, queue and cache table at its size.
    steps(40, &mut head);
    let ((), counted) = count_allocations(|| steps(100, &mut head));
    assert_eq!(counted.allocs, 0, "{} allocations over 100 rounds of two steps; the first of {} bytes", counted.allocs, counted.first_size);
    assert!(batches.iter().all(|rows| rows.iter().all(|r| r.pos == prompt.len() + 140)), "every sequence went on");
}
