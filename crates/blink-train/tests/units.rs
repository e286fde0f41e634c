//! A run driven unit by unit, as a serving engine drives a co-served job (units of a
//! few layers, a pool lent for each, units stopped part-way), ends bit-identical to the
//! run done back to back:
//! the same adapter, loss curve and evaluation figures, with a resume from a checkpoint
//! taken between units on the way.

use std::path::PathBuf;
use std::sync::Arc;

use blink_gguf::GgufFile;
use blink_model::lora::LoraTarget;
use blink_model::{Model, TensorPlacement};
use blink_text::{ChatTemplate, Tokenizer};
use blink_train::data::{load_examples, Example};
use blink_train::optim::Decay;
use blink_train::run::{init, FinetuneConfig, Finetune, Observer, Outcome, Progress, Unit};

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

struct Setup {
    model: Arc<Model>,
    train: Vec<Example>,
    eval: Vec<Example>,
}

fn setup() -> Setup {
    let path = match std::env::var_os("BLINK_MODEL").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => blink_model::fetch::ensure_default_model().expect("fetching the default model"),
    };
    let file = Arc::new(GgufFile::open(&path).expect("opening the model"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let (tmpl, _) = ChatTemplate::from_gguf_or_chatml(&file).expect("chat template");
    let tmpl = tmpl.unwrap_or_else(ChatTemplate::chatml);
    let model = Arc::new(Model::from_gguf_placed(file, &TensorPlacement::flat(2)).expect("loading the model"));
    let all = load_examples(testdata().join("finetune/zorbania-train.jsonl"), &tok, &tmpl).expect("the Zorbania set");
    Setup { model, train: all[..6].to_vec(), eval: all[6..8].to_vec() }
}

fn config() -> FinetuneConfig {
    FinetuneConfig {
        lr: 1e-3,
        epochs: 2,
        batch_tokens: 160,
        batch_examples: usize::MAX,
        accum: 2,
        warmup: 1,
        decay: Decay::Cosine,
        weight_decay: 0.01,
        clip: Some(1.0),
        dropout: 0.1,
        seed: 7,
        checkpoint_every: Some(1),
    }
}

fn new_run(s: &Setup) -> Finetune<Arc<Model>> {
    let params = init::fresh(&s.model.cfg, 4, 8.0, &[LoraTarget::Q, LoraTarget::V, LoraTarget::Down], 7);
    Finetune::new(s.model.clone(), config(), s.train.clone(), s.eval.clone(), params, "units-test".into()).unwrap()
}

struct Quiet;
impl Observer for Quiet {
    fn step(&mut self, _: &Progress) {}
}

fn bits(run: &Finetune<Arc<Model>>) -> (Vec<u32>, String) {
    let params = init::tensors(run.params()).iter().flat_map(|t| t.iter().map(|v| v.to_bits())).collect();
    (params, format!("{:?}", run.curve()))
}

#[test]
fn units_of_any_size_end_where_the_whole_run_ends() {
    let s = setup();
    let pool = s.model.pool(2).unwrap();
    let dir = std::env::temp_dir().join(format!("blink-units-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let mut whole = new_run(&s);
    whole.run(&pool, &dir, &mut Quiet).unwrap();
    let want = bits(&whole);
    assert!(whole.curve().iter().filter(|p| p.eval_loss.is_some()).count() == 2, "an evaluation after each epoch");

    // Units of 1 and 7 layers, and units of every layer left that are stopped at every
    // fifth layer boundary (as a request's arrival stops a co-served unit).
    for (layers, stop_every) in [(1, None), (7, None), (usize::MAX, Some(5))] {
        // A pool of another size lent for the units changes nothing either.
        let other_pool = s.model.pool(1).unwrap();
        let mut run = new_run(&s);
        let (mut units, mut steps, mut evals, mut saw_optimizer, mut stopped) = (0, 0, 0, false, 0);
        let mut resumed = false;
        let asked = std::cell::Cell::new(0usize);
        let stop = || {
            asked.set(asked.get() + 1);
            stop_every.is_some_and(|n| asked.get().is_multiple_of(n))
        };
        loop {
            let left = match run.next_unit().unwrap() {
                None => break,
                Some(Unit::GradNorm { layers: left, params } | Unit::Optimizer { layers: left, params }) => {
                    // The layers and parameters left: all of them at each part's start.
                    let n_layers = run.params().layers.len();
                    let per_layer = init::tensors(run.params()).iter().map(|t| t.len()).sum::<usize>() / n_layers;
                    assert!(left >= 1 && left <= n_layers);
                    assert_eq!(params, per_layer * left);
                    saw_optimizer = true;
                    left
                }
                Some(Unit::Batch(shape)) => {
                    assert!(shape.rows > 0 && shape.rows <= 160);
                    shape.layers
                }
            };
            let lent = if units % 2 == 0 { &pool } else { &other_pool };
            let outcome = if stop_every.is_some() {
                let asked_before = asked.get();
                let (outcome, ran) = run.run_unit_until(lent, layers, &stop).unwrap();
                // A head runs whole; a unit over layers runs until it is told to stop.
                let told = asked.get() - asked_before;
                if left == 0 {
                    assert_eq!((ran, told), (0, 0));
                } else {
                    assert!(ran >= 1 && ran <= left && told == ran - usize::from(ran == left));
                    stopped += usize::from(ran < left);
                }
                outcome
            } else {
                run.run_unit(lent, layers).unwrap()
            };
            match outcome {
                Outcome::Stepped(_) => steps += 1,
                Outcome::Evaluated { .. } => evals += 1,
                Outcome::Working => {}
                Outcome::Finished => unreachable!("next_unit said a unit was left"),
            }
            units += 1;
            // Take a checkpoint at the first commit point after step 2 and continue from
            // it in a fresh run, as a restarted server does.
            if !resumed && run.at_commit_point() && run.steps_done() == 2 {
                let ckpt = dir.join(format!("ckpt-{layers}"));
                std::fs::create_dir_all(&ckpt).unwrap();
                blink_train::checkpoint::save(&ckpt, &run.checkpoint_state()).unwrap();
                run = new_run(&s);
                assert!(run.resume(&ckpt).unwrap());
                resumed = true;
            }
        }
        assert!(resumed && saw_optimizer);
        assert!(stop_every.is_none() || stopped > 10, "only {stopped} units were stopped");
        assert_eq!(evals, 2, "units of {layers}: evaluations");
        assert_eq!(steps as u64, run.total_steps(), "units of {layers}: steps");
        assert!(bits(&run) == want, "units of {layers} layers end elsewhere than the whole run");
        assert!(units > 3 * run.total_steps() as usize, "units of {layers}: only {units} units");
        assert!(matches!(run.run_unit(&pool, layers).unwrap(), Outcome::Finished));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
