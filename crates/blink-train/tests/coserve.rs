//! A fine-tuning job co-served by the real engine, while requests come and go: it trains
//! exactly as the standalone run with its settings does (the same adapter bits and loss
//! curve), the requests' outputs are the ones the engine gives without training, and the
//! units run both beside requests and in idle steps, timed by the latency model.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blink_engine::serve::latency::StepKind;
use blink_engine::serve::{Engine, EngineConfig, Event, Request, SloTargets, TrainingPolicy};
use blink_engine::SamplingParams;
use blink_gguf::GgufFile;
use blink_model::lora::{self, LoraTarget};
use blink_model::{KvType, Model, TensorPlacement};
use blink_text::{ChatTemplate, Tokenizer};
use blink_train::checkpoint;
use blink_train::data::load_examples;
use blink_train::jobs::{AdapterSink, BaseModel, CoServedJobs, JobService, JobSettings};
use blink_train::run::{fingerprint, init, Finetune, Observer, Progress};
use blink_train::store::{FileStore, Hyperparameters, JobSpec, JobStatus};

/// Records what the service publishes.
#[derive(Default)]
struct Published(Mutex<Vec<(String, PathBuf)>>);

impl AdapterSink for Published {
    fn publish(&self, name: &str, dir: &Path) -> Result<(), String> {
        self.0.lock().unwrap().push((name.to_string(), dir.to_path_buf()));
        Ok(())
    }
}

struct Quiet;
impl Observer for Quiet {
    fn step(&mut self, _: &Progress) {}
}

fn engine_config() -> EngineConfig {
    EngineConfig {
        n_threads: 2,
        kv_tokens: 4096,
        max_seq_len: 512,
        step_tokens: 64,
        max_running: 4,
        max_queue: 64,
        kv_type: KvType::F16,
        swa_full: false,
        prefix_cache: true,
        prefix_cache_tokens: None,
        max_loras: 4,
        slo: SloTargets { ttft: Duration::from_millis(1500), tpot: Duration::from_millis(150) },
        training: TrainingPolicy::Slo,
        latency: None,
    }
}

/// Greedy outputs of `prompts`, submitted `gap` apart, all in flight together at most.
fn serve(engine: &Engine, prompts: &[Vec<u32>], gap: Duration) -> Vec<Vec<u32>> {
    let mut subs = Vec::new();
    for p in prompts {
        let request = Request { prompt: p.clone(), max_tokens: 24, sampling: SamplingParams::greedy(), logprobs: None, ignore_eos: true, adapter: None };
        subs.push(engine.submit(request).unwrap());
        std::thread::sleep(gap);
    }
    subs.into_iter()
        .map(|mut s| {
            let mut out = Vec::new();
            while let Some(e) = s.blocking_next() {
                match e {
                    Event::Token { id, .. } => out.push(id),
                    Event::Failed(e) => panic!("a request failed: {e}"),
                    _ => {}
                }
            }
            out
        })
        .collect()
}

#[test]
fn a_co_served_job_trains_as_the_standalone_run_and_leaves_requests_alone() {
    let path = blink_model::fetch::ensure_default_model().expect("the default model");
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let tokenizer = Arc::new(Tokenizer::from_gguf(&file).unwrap());
    let template = Arc::new(ChatTemplate::from_gguf_or_chatml(&file).unwrap().0.unwrap_or_else(ChatTemplate::chatml));
    let model = Arc::new(Model::from_gguf_placed(file, &TensorPlacement::flat(2)).unwrap());
    let eog = tokenizer.eog_ids().to_vec();
    let prompts: Vec<Vec<u32>> = ["Tell me about the sea.", "What is two plus two?", "Name three colours.", "Write a line of a poem."]
        .iter()
        .map(|p| tokenizer.encode(p, false, false))
        .collect();

    // What the engine answers without training.
    let plain = Engine::start(model.clone(), eog.clone(), engine_config()).unwrap();
    let want = serve(&plain, &prompts, Duration::ZERO);
    drop(plain);

    let dir = std::env::temp_dir().join(format!("blink-coserve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let lines: Vec<&str> = include_str!("../../../testdata/finetune/zorbania-train.jsonl").lines().take(6).collect();
    let files = Arc::new(FileStore::open(&dir).unwrap());
    let upload = files.create("train.jsonl", "fine-tune", (lines.join("\n") + "\n").as_bytes()).unwrap();
    let settings = JobSettings { rank: 4, alpha: 8.0, targets: vec![LoraTarget::Q, LoraTarget::V, LoraTarget::Down], batch_tokens: 160, ..JobSettings::default() };
    let base = BaseModel { model: model.clone(), path: path.clone(), tokenizer: tokenizer.clone(), template: template.clone(), names: vec!["base".into()] };
    let published = Arc::new(Published::default());
    let (service, executor) = JobService::start(&dir, files.clone(), base, settings.clone(), published.clone()).unwrap();
    let engine = Engine::start_with(model.clone(), eog, engine_config(), Some(Box::new(CoServedJobs::new(executor)))).unwrap();
    let waker = engine.clone();
    service.set_waker(Box::new(move || waker.wake()));

    let spec = JobSpec {
        model: "base".into(),
        training_file: upload.id.clone(),
        validation_file: None,
        suffix: Some("zorb".into()),
        seed: 3,
        hyperparameters: Hyperparameters { n_epochs: 2, batch_size: 2, learning_rate_multiplier: 1.0 },
    };
    let job = service.create(spec.clone()).unwrap();

    // Requests come while the job trains, twice: their outputs must not change.
    let started = Instant::now();
    while service.get(&job.id).unwrap().status != JobStatus::Running {
        assert!(started.elapsed() < Duration::from_secs(60), "the job never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    for round in 0..2 {
        std::thread::sleep(Duration::from_millis(300));
        assert!(serve(&engine, &prompts, Duration::from_millis(40)) == want, "round {round}: training changed a request's output");
    }
    let done = loop {
        let j = service.get(&job.id).unwrap();
        if j.status.is_final() {
            break j;
        }
        assert!(started.elapsed() < Duration::from_secs(600), "the job did not finish: {:?}", j.status);
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(done.status, JobStatus::Succeeded, "{:?}", done.error);
    let name = done.fine_tuned_model.clone().unwrap();
    assert_eq!(name, format!("ft:base:zorb:{}", job.id));
    let stats = engine.stats();
    eprintln!(
        "units {} ({} beside requests, {} stopped by an arrival), {:.1} s of training; latency {:?}",
        stats.train_units_total, stats.train_units_beside_requests, stats.train_units_stopped, stats.train_seconds_total, stats.latency
    );
    assert!(stats.train_units_total > 0 && stats.train_units_beside_requests > 0, "units: {} beside requests of {}", stats.train_units_beside_requests, stats.train_units_total);
    let count = |k: StepKind| stats.latency[StepKind::ALL.iter().position(|&x| x == k).unwrap()].count;
    assert!(count(StepKind::TrainForward) > 0 && count(StepKind::TrainBackward) > 0 && count(StepKind::Decode) > 0);

    // The standalone run with the job's settings.
    let train = load_examples(files.path(&upload.id).unwrap(), &tokenizer, &template).unwrap();
    let cfg = settings.finetune_config(&spec);
    let params = init::fresh(&model.cfg, settings.rank, settings.alpha, &settings.targets, cfg.seed);
    let fp = fingerprint(&path, &train, &[], &params, &cfg, "job");
    let mut alone = Finetune::new(model.clone(), cfg, train, Vec::new(), params, fp).unwrap();
    let pool = model.pool(1).unwrap();
    let out = dir.join("alone");
    std::fs::create_dir_all(&out).unwrap();
    alone.run(&pool, &out, &mut Quiet).unwrap();

    let job_dir = dir.join("jobs").join(&job.id);
    let served = lora::read(&job_dir.join("adapter"), &model.cfg).unwrap();
    let bits = |t: &lora::LoraTensors| init::tensors(t).iter().flat_map(|x| x.iter().map(|v| v.to_bits())).collect::<Vec<_>>();
    assert!(bits(&served) == bits(alone.params()), "the co-served adapter differs from the standalone run's");
    let committed = checkpoint::load(&job_dir).unwrap().unwrap();
    assert_eq!(format!("{:?}", committed.curve), format!("{:?}", alone.curve()), "the loss curves differ");
    assert_eq!(done.trained_tokens, Some(alone.trained_tokens()));
    let names: Vec<String> = published.0.lock().unwrap().iter().map(|(n, _)| n.clone()).collect();
    assert!(names.contains(&name) && names.iter().any(|n| n.ends_with(":ckpt-step-3")), "published {names:?}");
    // Every committed step is logged once, in order.
    let (events, _) = service.events(&job.id, None, 1000).unwrap();
    let mut steps: Vec<u64> = events.iter().filter(|e| e.kind == "metrics").filter_map(|e| e.data["step"].as_u64()).collect();
    steps.reverse();
    assert_eq!(steps, (1..=alone.steps_done()).collect::<Vec<_>>());
    drop(engine);
    drop(service);
    let _ = std::fs::remove_dir_all(&dir);
}
