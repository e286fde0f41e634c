//! The step latency model (`serve::latency`): the offline fit recovers known coefficients,
//! the online refit follows a drift that leaves the frozen offline model behind, an
//! outlier does not wreck it, margins follow the error distribution, the coefficient file
//! round-trips and every kind of bad file is an error, and observing allocates nothing.
//!
//! Steps are synthetic: costs drawn as the scheduler builds them (plan.rs's formulas), and
//! times from known coefficients with multiplicative noise.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::Duration;

use blink_engine::rng::Rng;
use blink_engine::serve::latency::{
    Coefficients, LatencyConfig, LatencyFileError, LatencyModel, PassCoefficients, Sample, StepKind, UnitCoefficients, UnitCost,
    UnitKind,
};
use blink_engine::serve::StepCost;

// ---- a counting allocator, counting only on the thread that asks ----

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn count_alloc() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_alloc();
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_alloc();
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---- synthetic steps ----

/// A small model on a few cores: a 512-token prefill about 35 ms, 32 decode rows about
/// 10 ms.
const PASS_TRUTH: PassCoefficients = PassCoefficients {
    base: 1.5e-3,
    prompt_token: 60e-6,
    chunk_token_squared: 4e-9,
    decode_row: 250e-6,
    context_token: 15e-9,
    adapter: 0.4e-3,
};

const UNIT_TRUTH: UnitCoefficients = UnitCoefficients {
    base: 0.5e-3,
    forward_row_layer: 4e-6,
    forward_attn_layer: 2e-9,
    backward_row_layer: 9e-6,
    backward_attn_layer: 5e-9,
    head_row: 50e-6,
    optimizer_param: 3e-9,
    norm_param: 0.5e-9,
};

fn below(rng: &mut Rng, n: usize) -> usize {
    (rng.next_f64() * n as f64) as usize
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut Rng) -> f64 {
    let u = 1.0 - rng.next_f64();
    let v = rng.next_f64();
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

/// A pass of `kind` as the scheduler plans one: decode rows at random positions, prompt
/// chunks at random starts (cached prefixes), a few adapters.
fn pass_of(rng: &mut Rng, kind: StepKind) -> StepCost {
    let mut c = StepCost::default();
    if kind != StepKind::Prefill {
        c.decode_rows = 1 + below(rng, 64);
        for _ in 0..c.decode_rows {
            c.context_tokens += 1 + below(rng, 2048);
        }
    }
    if kind != StepKind::Decode {
        for _ in 0..1 + below(rng, 3) {
            let (len, start) = (1 + below(rng, 512), below(rng, 1024));
            c.prompt_tokens += len;
            c.chunk_tokens_squared += len * len;
            c.context_tokens += len * start + len * (len + 1) / 2;
        }
    }
    c.adapters = below(rng, 5);
    c
}

fn random_pass(rng: &mut Rng) -> StepCost {
    let kind = [StepKind::Decode, StepKind::Prefill, StepKind::Mixed][below(rng, 3)];
    pass_of(rng, kind)
}

/// A training unit of `kind` on a batch of packed examples of up to 512 tokens.
fn unit_of(rng: &mut Rng, kind: UnitKind) -> UnitCost {
    let (mut rows, mut attn) = (0, 0);
    while rows < 256 {
        let len = (16 + below(rng, 300)).min(512 - rows);
        rows += len;
        attn += len * len;
    }
    let layers = match kind {
        UnitKind::Forward => 1 + below(rng, 30),
        UnitKind::Backward => 1 + below(rng, 8),
        _ => 0,
    };
    let head_rows = if kind == UnitKind::Head { 1 + below(rng, rows) } else { 0 };
    let params = if matches!(kind, UnitKind::Optimizer | UnitKind::GradNorm) { 100_000 + below(rng, 2_000_000) } else { 0 };
    UnitCost { kind, rows, attn, layers, head_rows, params }
}

fn random_unit(rng: &mut Rng) -> UnitCost {
    let kind = [UnitKind::Forward, UnitKind::Head, UnitKind::Backward, UnitKind::GradNorm, UnitKind::Optimizer][below(rng, 5)];
    unit_of(rng, kind)
}

fn pass_seconds(k: &PassCoefficients, c: &StepCost) -> f64 {
    k.base
        + k.prompt_token * c.prompt_tokens as f64
        + k.chunk_token_squared * c.chunk_tokens_squared as f64
        + k.decode_row * c.decode_rows as f64
        + k.context_token * c.context_tokens as f64
        + k.adapter * c.adapters as f64
}

fn unit_seconds(k: &UnitCoefficients, u: &UnitCost) -> f64 {
    let l = u.layers as f64;
    k.base
        + match u.kind {
            UnitKind::Forward => (k.forward_row_layer * u.rows as f64 + k.forward_attn_layer * u.attn as f64) * l,
            UnitKind::Backward => (k.backward_row_layer * u.rows as f64 + k.backward_attn_layer * u.attn as f64) * l,
            UnitKind::Head => k.head_row * u.head_rows as f64,
            UnitKind::Optimizer => k.optimizer_param * u.params as f64,
            UnitKind::GradNorm => k.norm_param * u.params as f64,
        }
}

/// `seconds` with multiplicative Gaussian noise of relative deviation `noise`.
fn noisy(rng: &mut Rng, seconds: f64, noise: f64) -> Duration {
    Duration::from_secs_f64(seconds * (1.0 + noise * normal(rng)).max(0.2))
}

fn samples(rng: &mut Rng, passes: usize, units: usize, noise: f64) -> Vec<Sample> {
    let mut out = Vec::new();
    for _ in 0..passes {
        let cost = random_pass(rng);
        out.push(Sample::Pass { cost, time: noisy(rng, pass_seconds(&PASS_TRUTH, &cost), noise) });
    }
    for _ in 0..units {
        let cost = random_unit(rng);
        out.push(Sample::Unit { cost, time: noisy(rng, unit_seconds(&UNIT_TRUTH, &cost), noise) });
    }
    out
}

fn calibrated(seed: u64) -> Coefficients {
    Coefficients::fit(&samples(&mut Rng::new(seed), 3000, 2000, 0.03))
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b
}

/// Equal but for the rounding of durations to nanoseconds.
fn same(a: Duration, b: Duration) -> bool {
    a.abs_diff(b) <= Duration::from_nanos(2)
}

fn report(model: &mut LatencyModel, kind: StepKind) -> blink_engine::serve::latency::KindError {
    model.errors().into_iter().find(|e| e.kind == kind).unwrap()
}

// ---- the offline fit ----

#[test]
fn fit_recovers_known_coefficients_from_noisy_samples() {
    let c = calibrated(1);
    let (pass, unit) = (c.pass.to_array(), c.unit.to_array());
    let (pass_truth, unit_truth) = (PASS_TRUTH.to_array(), UNIT_TRUTH.to_array());
    eprintln!("pass fitted {pass:?}\nunit fitted {unit:?}\nreport {:#?}", c.fit);
    for i in 0..pass.len() {
        assert!(rel(pass[i], pass_truth[i]) < 0.05, "pass coefficient {i}: {} vs {}", pass[i], pass_truth[i]);
    }
    for i in 0..unit.len() {
        assert!(rel(unit[i], unit_truth[i]) < 0.05, "unit coefficient {i}: {} vs {}", unit[i], unit_truth[i]);
    }
    assert_eq!((c.fit.pass_samples, c.fit.unit_samples), (3000, 2000));
    assert!(c.fit.unexercised.is_empty());
    assert_eq!(c.fit.kinds.len(), 7);
    // 3% Gaussian noise: the median |relative error| is about 0.674 × 3% = 2%.
    for k in &c.fit.kinds {
        assert!((0.015..0.026).contains(&k.median_abs_error), "{k:?}");
        assert!(k.p95_abs_error > k.median_abs_error && k.p95_abs_error < 0.08, "{k:?}");
    }
}

#[test]
fn fit_keeps_coefficients_non_negative_and_refits_the_rest() {
    // Data made with a negative context coefficient: the unconstrained fit would follow it.
    let truth = PassCoefficients { context_token: -2e-9, ..PASS_TRUTH };
    let mut rng = Rng::new(2);
    let samples: Vec<Sample> = (0..2000)
        .map(|_| {
            let cost = pass_of(&mut rng, StepKind::Decode);
            Sample::Pass { cost, time: Duration::from_secs_f64(pass_seconds(&truth, &cost)) }
        })
        .collect();
    let c = Coefficients::fit(&samples);
    assert_eq!(c.pass.context_token, 0.0);
    assert!(c.pass.to_array().iter().all(|&v| v >= 0.0), "{:?}", c.pass);
    // The others absorb what they can: decode rows carry ~1k context each, so the decode
    // row coefficient falls a little below its truth and the fit stays close.
    assert!(c.pass.decode_row < PASS_TRUTH.decode_row && c.pass.decode_row > 0.9 * PASS_TRUTH.decode_row, "{:?}", c.pass);
    let decode = c.fit.kinds.iter().find(|k| k.kind == StepKind::Decode).unwrap();
    assert!(decode.median_abs_error < 0.01, "{decode:?}");
    // Decode-only samples exercise no prompt feature: those are reported and set to 0;
    // no unit samples: the unit part keeps the uncalibrated coefficients.
    assert_eq!(c.fit.unexercised, ["pass.prompt_token", "pass.chunk_token_squared"]);
    assert_eq!((c.pass.prompt_token, c.pass.chunk_token_squared), (0.0, 0.0));
    assert_eq!(c.unit, UnitCoefficients::uncalibrated());
    assert_eq!(c.fit.unit_samples, 0);
}

// ---- the online refit ----

/// Feeds `n` passes and `n` units made with `pass`/`unit` coefficients to `model`.
fn feed(model: &mut LatencyModel, rng: &mut Rng, n: usize, pass: &PassCoefficients, unit: &UnitCoefficients, noise: f64) {
    for _ in 0..n {
        let cost = random_pass(rng);
        let t = noisy(rng, pass_seconds(pass, &cost), noise);
        model.observe_pass(&cost, t);
        let cost = random_unit(rng);
        let t = noisy(rng, unit_seconds(unit, &cost), noise);
        model.observe_unit(&cost, t);
    }
}

#[test]
fn online_refit_tracks_a_drift_the_offline_model_misses() {
    let mut model = LatencyModel::new(calibrated(3));
    let mut rng = Rng::new(4);
    feed(&mut model, &mut rng, 1000, &PASS_TRUTH, &UNIT_TRUTH, 0.03);
    for e in model.errors() {
        let (on, off) = (e.median_online.unwrap(), e.median_offline.unwrap());
        assert!(on < 0.03 && off < 0.03, "before the drift: {e:?}");
    }
    // Every coefficient moves by 30%, some up, some down.
    let pass = PassCoefficients {
        base: PASS_TRUTH.base * 1.3,
        prompt_token: PASS_TRUTH.prompt_token * 1.3,
        chunk_token_squared: PASS_TRUTH.chunk_token_squared * 0.7,
        decode_row: PASS_TRUTH.decode_row * 0.7,
        context_token: PASS_TRUTH.context_token * 1.3,
        adapter: PASS_TRUTH.adapter * 0.7,
    };
    let unit = UnitCoefficients {
        base: UNIT_TRUTH.base * 0.7,
        forward_row_layer: UNIT_TRUTH.forward_row_layer * 1.3,
        forward_attn_layer: UNIT_TRUTH.forward_attn_layer * 0.7,
        backward_row_layer: UNIT_TRUTH.backward_row_layer * 0.7,
        backward_attn_layer: UNIT_TRUTH.backward_attn_layer * 1.3,
        head_row: UNIT_TRUTH.head_row * 1.3,
        optimizer_param: UNIT_TRUTH.optimizer_param * 0.7,
        norm_param: UNIT_TRUTH.norm_param * 0.7,
    };
    // Each part's relative errors on every step after the drift, online and offline (as
    // the model takes them: before it sees the step).
    let offline = model.offline().clone();
    let mut post: Vec<Vec<(f64, f64)>> = vec![Vec::new(); 7];
    let relative = |t: Duration, predicted: f64| (t.as_secs_f64() - predicted).abs() / predicted;
    for _ in 0..1500 {
        let cost = random_pass(&mut rng);
        let t = noisy(&mut rng, pass_seconds(&pass, &cost), 0.03);
        let kind = StepKind::of_pass(&cost).unwrap();
        post[kind.index()].push((relative(t, model.predict_pass(&cost).as_secs_f64()), relative(t, pass_seconds(&offline.pass, &cost))));
        model.observe_pass(&cost, t);
        let cost = random_unit(&mut rng);
        let t = noisy(&mut rng, unit_seconds(&unit, &cost), 0.03);
        let kind = StepKind::of_unit(&cost);
        post[kind.index()].push((relative(t, model.predict_unit(&cost).as_secs_f64()), relative(t, unit_seconds(&offline.unit, &cost))));
        model.observe_unit(&cost, t);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for kind in StepKind::ALL {
        let errors = &post[kind.index()];
        // The drift is real: the first observations of each kind are off by more than 10%.
        let first = median(&mut errors[..5].iter().map(|e| e.0).collect());
        // Recovery: the first observation of this kind from which the median over the
        // next 25 is under 10%.
        let recovered = (0..errors.len() - 25).find(|&i| median(&mut errors[i..i + 25].iter().map(|e| e.0).collect()) < 0.10).unwrap();
        // Its share of the part's observations: about 1/3 of passes, 1/4 of units.
        let share = if kind.index() < 3 { 3 } else { 4 };
        let later = &errors[errors.len() / 2..];
        let online = median(&mut later.iter().map(|e| e.0).collect());
        let offline = median(&mut later.iter().map(|e| e.1).collect());
        eprintln!(
            "{:>14}: first {first:.3}, recovered at its {recovered}th observation (~{} of its part), then online {online:.4} offline {offline:.4}",
            kind.name(),
            recovered * share
        );
        assert!(first > 0.10, "{kind:?}: the drift did not show ({first})");
        assert!(recovered * share <= 300, "{kind:?} recovered only at its {recovered}th observation");
        assert!(online < 0.03, "{kind:?}: online {online} after the drift");
        assert!(offline > 0.10, "{kind:?}: offline {offline} after the drift");
    }
    // The model's own figures, side by side: its windows now hold only steps after the
    // drift.
    for e in model.errors() {
        let (on, off) = (e.median_online.unwrap(), e.median_offline.unwrap());
        assert!(on < 0.03 && off > 0.10, "after the drift: {e:?}");
    }
    assert_eq!(model.resets(), 0);
}

#[test]
fn an_uncalibrated_model_predicts_long_steps_until_it_has_data() {
    let mut model = LatencyModel::uncalibrated();
    let mut rng = Rng::new(5);
    let decode = pass_of(&mut rng, StepKind::Decode);
    let prefill = pass_of(&mut rng, StepKind::Prefill);
    assert!(model.predict_pass(&decode) >= Duration::from_millis(250));
    assert!(model.predict_unit(&unit_of(&mut rng, UnitKind::Head)) >= Duration::from_millis(250));
    assert!(same(model.predict_pass_with_margin(&decode), model.predict_pass(&decode).mul_f64(1.5)));
    // Decode steps only: decode predictions come down to the truth, prefills stay long
    // (nothing taught the model what a prompt token costs).
    for _ in 0..300 {
        let cost = pass_of(&mut rng, StepKind::Decode);
        model.observe_pass(&cost, noisy(&mut rng, pass_seconds(&PASS_TRUTH, &cost), 0.03));
    }
    let e = report(&mut model, StepKind::Decode);
    eprintln!("after 300 decode steps: {e:?}");
    assert!(e.median_online.unwrap() < 0.04, "{e:?}");
    let predicted = model.predict_pass(&decode).as_secs_f64();
    assert!(rel(predicted, pass_seconds(&PASS_TRUTH, &decode)) < 0.03, "{predicted}");
    let predicted = model.predict_pass(&prefill).as_secs_f64();
    assert!(predicted > 10.0 * pass_seconds(&PASS_TRUTH, &prefill), "{predicted}");
    // Then every kind: all come to the noise (3%: a median |error| of 2%).
    feed(&mut model, &mut rng, 1000, &PASS_TRUTH, &UNIT_TRUTH, 0.03);
    for e in model.errors() {
        eprintln!("uncalibrated, after 1000 steps of each part: {e:?}");
        assert!(e.median_online.unwrap() < 0.03, "{e:?}");
    }
}

#[test]
fn a_kind_that_the_linear_form_misses_is_taken_up_by_its_scale() {
    // Decode steps run 25% slower than the shared linear form says (a decode row alone
    // streams the weights); the other kinds are as it says.
    let mut model = LatencyModel::new(calibrated(21));
    let mut rng = Rng::new(22);
    let mut decode_errors = Vec::new();
    let mut prefill_errors = Vec::new();
    for i in 0..1200 {
        let kind = [StepKind::Decode, StepKind::Prefill, StepKind::Mixed][i % 3];
        let cost = pass_of(&mut rng, kind);
        let slow = if kind == StepKind::Decode { 1.25 } else { 1.0 };
        let t = noisy(&mut rng, slow * pass_seconds(&PASS_TRUTH, &cost), 0.03);
        let err = rel(t.as_secs_f64(), model.predict_pass(&cost).as_secs_f64());
        if i >= 900 {
            match kind {
                StepKind::Decode => decode_errors.push(err),
                StepKind::Prefill => prefill_errors.push(err),
                _ => {}
            }
        }
        model.observe_pass(&cost, t);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (d, p) = (median(&mut decode_errors), median(&mut prefill_errors));
    eprintln!("decode 25% off the linear form: median error {d:.4}; prefill {p:.4}");
    assert!(d < 0.04 && p < 0.04, "decode {d}, prefill {p}");
}

/// Relative change of the model's predictions over fixed steps of every kind.
fn largest_change(before: &[f64], model: &LatencyModel, passes: &[StepCost], units: &[UnitCost]) -> f64 {
    let now = passes.iter().map(|c| model.predict_pass(c).as_secs_f64()).chain(units.iter().map(|u| model.predict_unit(u).as_secs_f64()));
    before.iter().zip(now).map(|(b, n)| rel(n, *b)).fold(0.0, f64::max)
}

#[test]
fn an_outlier_does_not_wreck_the_fit() {
    let mut model = LatencyModel::new(calibrated(6));
    let mut rng = Rng::new(7);
    feed(&mut model, &mut rng, 500, &PASS_TRUTH, &UNIT_TRUTH, 0.03);
    let passes: Vec<StepCost> = (0..60).map(|_| random_pass(&mut rng)).collect();
    let units: Vec<UnitCost> = (0..40).map(|_| random_unit(&mut rng)).collect();
    let predictions = |m: &LatencyModel| -> Vec<f64> {
        passes.iter().map(|c| m.predict_pass(c).as_secs_f64()).chain(units.iter().map(|u| m.predict_unit(u).as_secs_f64())).collect()
    };
    // One step of each kind that took 10× its time (the machine was preempted).
    for kind in [StepKind::Decode, StepKind::Prefill, StepKind::Mixed] {
        let before = predictions(&model);
        let cost = pass_of(&mut rng, kind);
        model.observe_pass(&cost, Duration::from_secs_f64(10.0 * pass_seconds(&PASS_TRUTH, &cost)));
        let change = largest_change(&before, &model, &passes, &units);
        eprintln!("a 10× {kind:?} step moved predictions by at most {:.3}%", 100.0 * change);
        // At most 0.15% through the kind's scale, the rest through the shared fit.
        assert!(change < 0.0025, "a 10× {kind:?} step moved a prediction by {:.2}%", 100.0 * change);
    }
    for kind in [UnitKind::Forward, UnitKind::Head, UnitKind::Backward, UnitKind::GradNorm, UnitKind::Optimizer] {
        let before = predictions(&model);
        let cost = unit_of(&mut rng, kind);
        model.observe_unit(&cost, Duration::from_secs_f64(10.0 * unit_seconds(&UNIT_TRUTH, &cost)));
        let change = largest_change(&before, &model, &passes, &units);
        eprintln!("a 10× {kind:?} unit moved predictions by at most {:.3}%", 100.0 * change);
        assert!(change < 0.0025, "a 10× {kind:?} unit moved a prediction by {:.2}%", 100.0 * change);
    }
    // A step timed at a tenth of its time (a clock glitch) weighs 100× more under 1/t²:
    // the clip is what holds it.
    for kind in [StepKind::Decode, StepKind::Prefill, StepKind::Mixed] {
        let before = predictions(&model);
        let cost = pass_of(&mut rng, kind);
        model.observe_pass(&cost, Duration::from_secs_f64(0.1 * pass_seconds(&PASS_TRUTH, &cost)));
        let change = largest_change(&before, &model, &passes, &units);
        eprintln!("a 0.1× {kind:?} step moved predictions by at most {:.3}%", 100.0 * change);
        assert!(change < 0.01, "a 0.1× {kind:?} step moved a prediction by {:.2}%", 100.0 * change);
    }
    feed(&mut model, &mut rng, 300, &PASS_TRUTH, &UNIT_TRUTH, 0.03);
    // One step in fifty preempted, for a while: predictions stay within 2% of the truth.
    for i in 0..2000 {
        let cost = random_pass(&mut rng);
        let slow = if i % 50 == 0 { 10.0 } else { 1.0 };
        model.observe_pass(&cost, noisy(&mut rng, slow * pass_seconds(&PASS_TRUTH, &cost), 0.03));
        let cost = random_unit(&mut rng);
        model.observe_unit(&cost, noisy(&mut rng, slow * unit_seconds(&UNIT_TRUTH, &cost), 0.03));
    }
    let worst_pass = passes.iter().map(|c| rel(model.predict_pass(c).as_secs_f64(), pass_seconds(&PASS_TRUTH, c))).fold(0.0, f64::max);
    let worst_unit = units.iter().map(|u| rel(model.predict_unit(u).as_secs_f64(), unit_seconds(&UNIT_TRUTH, u))).fold(0.0, f64::max);
    eprintln!("with 2% of steps at 10×: worst pass {worst_pass:.4}, worst unit {worst_unit:.4}");
    assert!(worst_pass < 0.02 && worst_unit < 0.02, "worst pass {worst_pass}, worst unit {worst_unit}");
    assert_eq!(model.resets(), 0);
}

// ---- margins ----

#[test]
fn margins_follow_the_error_distribution() {
    let mut model = LatencyModel::new(calibrated(8));
    let mut rng = Rng::new(9);
    // Too few observations: the default margin.
    for _ in 0..31 {
        let cost = pass_of(&mut rng, StepKind::Decode);
        model.observe_pass(&cost, noisy(&mut rng, pass_seconds(&PASS_TRUTH, &cost), 0.02));
    }
    let e = report(&mut model, StepKind::Decode);
    assert!(!e.margin_from_data && e.margin == 0.5, "{e:?}");
    let cost = pass_of(&mut rng, StepKind::Decode);
    assert!(same(model.predict_pass_with_margin(&cost), model.predict_pass(&cost).mul_f64(1.5)));
    model.observe_pass(&cost, noisy(&mut rng, pass_seconds(&PASS_TRUTH, &cost), 0.02));
    let e = report(&mut model, StepKind::Decode);
    assert!(e.margin_from_data && e.margin < 0.1, "{e:?}");
    // Decode steps with 2% noise, prefills with 10%: as many covered by the margin, and
    // the margins apart by about the noises' ratio.
    let mut errors = Vec::new();
    let (mut covered, mut total) = (0, 0);
    for i in 0..4000 {
        let (kind, noise) = if i % 2 == 0 { (StepKind::Decode, 0.02) } else { (StepKind::Prefill, 0.10) };
        let cost = pass_of(&mut rng, kind);
        let t = noisy(&mut rng, pass_seconds(&PASS_TRUTH, &cost), noise);
        let predicted = model.predict_pass(&cost).as_secs_f64();
        if i >= 1000 {
            total += 1;
            covered += usize::from(t <= model.predict_pass_with_margin(&cost));
        }
        if kind == StepKind::Prefill {
            errors.push((t.as_secs_f64() - predicted) / predicted);
        }
        model.observe_pass(&cost, t);
    }
    let coverage = covered as f64 / total as f64;
    let decode = report(&mut model, StepKind::Decode);
    let prefill = report(&mut model, StepKind::Prefill);
    eprintln!("coverage {coverage:.4}\n{decode:?}\n{prefill:?}");
    assert!((0.93..0.97).contains(&coverage), "coverage {coverage}");
    assert!(decode.margin_from_data && prefill.margin_from_data);
    // The 0.95 quantile of N(0, σ) errors is 1.645σ: 0.033 and 0.16, and a little more
    // for the online model's own error (its memory is ~200 steps).
    assert!((0.030..0.045).contains(&decode.margin), "{decode:?}");
    assert!((0.16..0.24).contains(&prefill.margin), "{prefill:?}");
    // Exactly the nearest-rank quantile of the last 256 prefill errors' positive parts.
    let mut last: Vec<f64> = errors[errors.len() - 256..].iter().map(|e| e.max(0.0)).collect();
    last.sort_by(f64::total_cmp);
    let expected = last[(0.95f64 * 256.0).ceil() as usize - 1];
    assert!((prefill.margin - expected).abs() < 1e-6, "margin {} vs the errors' quantile {expected}", prefill.margin);
    // A kind never observed keeps the default.
    let mixed = report(&mut model, StepKind::Mixed);
    assert_eq!((mixed.count, mixed.margin, mixed.margin_from_data), (0, 0.5, false));
    assert_eq!(mixed.median_online, None);
}

#[test]
fn the_margin_quantile_is_configurable() {
    let config = LatencyConfig { margin_quantile: 0.5, min_margin_samples: 8, ..LatencyConfig::default() };
    let mut model = LatencyModel::with_config(calibrated(10), config);
    let mut rng = Rng::new(11);
    for _ in 0..500 {
        let cost = pass_of(&mut rng, StepKind::Decode);
        model.observe_pass(&cost, noisy(&mut rng, pass_seconds(&PASS_TRUTH, &cost), 0.05));
    }
    // Half the errors are under-predictions: the median of their positive parts is ~0.
    assert!(model.margin(StepKind::Decode) < 0.01, "{}", model.margin(StepKind::Decode));
}

// ---- the coefficient file ----

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("blink-latency-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn with_setup(mut c: Coefficients) -> Coefficients {
    let setup = serde_json::json!({
        "model": "SmolLM2-135M-Instruct-Q4_1.gguf",
        "model_bytes": 98_123_456u64,
        "threads": 2,
        "kernel": "avx2",
        "dot_order": "llama"
    });
    c.setup = setup.as_object().unwrap().clone();
    c
}

#[test]
fn the_coefficient_file_round_trips() {
    let dir = TempDir::new("roundtrip");
    let path = dir.0.join("latency.json");
    let c = with_setup(calibrated(12));
    c.save(&path).unwrap();
    assert_eq!(Coefficients::load(&path).unwrap(), c);
    // Replacing it leaves no temporary file behind.
    let u = with_setup(Coefficients::uncalibrated());
    u.save(&path).unwrap();
    assert_eq!(Coefficients::load(&path).unwrap(), u);
    let names: Vec<_> = std::fs::read_dir(&dir.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["latency.json"]);
    // The online model's coefficients save too, with the offline setup and report.
    let model = LatencyModel::new(c.clone());
    let online = model.coefficients();
    assert_eq!((&online.setup, &online.fit), (&c.setup, &c.fit));
    online.save(&path).unwrap();
    assert_eq!(Coefficients::load(&path).unwrap(), online);
}

fn load_text(dir: &Path, name: &str, text: &str) -> LatencyFileError {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    Coefficients::load(&path).expect_err(name)
}

#[test]
fn every_kind_of_bad_file_is_an_error() {
    let dir = TempDir::new("bad");
    let good_path = dir.0.join("good.json");
    with_setup(calibrated(13)).save(&good_path).unwrap();
    let good = std::fs::read_to_string(&good_path).unwrap();
    let value: serde_json::Value = serde_json::from_str(&good).unwrap();
    let edited = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = value.clone();
        edit(&mut v);
        serde_json::to_string_pretty(&v).unwrap()
    };
    let malformed = |e: LatencyFileError, what: &str| {
        let message = e.to_string();
        assert!(matches!(e, LatencyFileError::Malformed { .. }), "{what}: {message}");
        assert!(!message.contains('\n'), "{what}: {message}");
        message
    };

    let missing = Coefficients::load(&dir.0.join("absent.json")).unwrap_err();
    assert!(matches!(&missing, LatencyFileError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound), "{missing}");
    assert!(missing.to_string().contains("absent.json"));

    malformed(load_text(&dir.0, "empty.json", ""), "empty");
    malformed(load_text(&dir.0, "text.json", "coefficients: 1, 2, 3"), "not JSON");
    malformed(load_text(&dir.0, "binary.json", "\u{0}\u{1}\u{2}"), "binary");
    for cut in [1, good.len() / 3, good.len() / 2, good.len() - 3] {
        malformed(load_text(&dir.0, "truncated.json", &good[..cut]), "truncated");
    }
    let m = malformed(load_text(&dir.0, "other.json", &edited(&|v| v["format"] = "llama-bench".into())), "wrong format");
    assert!(m.contains("llama-bench"), "{m}");
    match load_text(&dir.0, "v3.json", &edited(&|v| v["version"] = 3.into())) {
        LatencyFileError::Version { found: 3, .. } => {}
        e => panic!("wrong version: {e}"),
    }
    let m = malformed(load_text(&dir.0, "nofield.json", &edited(&|v| drop(v["pass"].as_object_mut().unwrap().remove("decode_row")))), "missing");
    assert!(m.contains("decode_row"), "{m}");
    malformed(load_text(&dir.0, "null.json", &edited(&|v| v["unit"]["head_row"] = serde_json::Value::Null)), "null coefficient");
    malformed(load_text(&dir.0, "string.json", &edited(&|v| v["pass"]["base"] = "fast".into())), "string coefficient");
    malformed(load_text(&dir.0, "setup.json", &edited(&|v| v["setup"] = 3.into())), "setup not an object");
    malformed(load_text(&dir.0, "kind.json", &edited(&|v| v["fit"]["kinds"][0]["kind"] = "warp".into())), "unknown kind");
    // JSON has no infinity; a number beyond f64 is refused by the parser.
    let huge = edited(&|v| v["pass"]["adapter"] = "HUGE".into()).replace("\"HUGE\"", "1e999");
    malformed(load_text(&dir.0, "huge.json", &huge), "non-finite");
    match load_text(&dir.0, "negative.json", &edited(&|v| v["pass"]["decode_row"] = (-1e-4).into())) {
        LatencyFileError::BadValue { field: "pass.decode_row", value: -1e-4, .. } => {}
        e => panic!("negative coefficient: {e}"),
    }
    // What cannot be read back is not written: a NaN coefficient is refused, and the file
    // it would replace is left as it was.
    let mut nan = calibrated(13);
    nan.unit.optimizer_param = f64::NAN;
    match nan.save(&good_path) {
        Err(LatencyFileError::BadValue { field: "unit.optimizer_param", .. }) => {}
        r => panic!("saving a NaN: {r:?}"),
    }
    assert_eq!(std::fs::read_to_string(&good_path).unwrap(), good);
    // Saving into a directory that does not exist is an I/O error.
    let e = calibrated(13).save(&dir.0.join("no/such/dir/latency.json")).unwrap_err();
    assert!(matches!(e, LatencyFileError::Io { .. }), "{e}");
}

// ---- allocation ----

#[test]
fn observing_and_predicting_allocate_nothing() {
    let mut model = LatencyModel::new(calibrated(14));
    let mut rng = Rng::new(15);
    let steps: Vec<(StepCost, Duration, UnitCost, Duration)> = (0..3000)
        .map(|_| {
            let (p, u) = (random_pass(&mut rng), random_unit(&mut rng));
            let tp = noisy(&mut rng, pass_seconds(&PASS_TRUTH, &p), 0.03);
            let tu = noisy(&mut rng, unit_seconds(&UNIT_TRUTH, &u), 0.03);
            (p, tp, u, tu)
        })
        .collect();
    let mut sum = Duration::ZERO;
    COUNTING.with(|c| c.set(true));
    // From the first observation on: the rings and scratch space exist from the start.
    for (p, tp, u, tu) in &steps {
        sum += model.predict_pass_with_margin(p) + model.predict_unit_with_margin(u);
        model.observe_pass(p, *tp);
        model.observe_unit(u, *tu);
    }
    COUNTING.with(|c| c.set(false));
    assert_eq!(ALLOCS.with(Cell::get), 0, "observe_* or predict_* allocated");
    assert!(sum > Duration::ZERO);
    // Reading the errors (once a second on the engine thread) allocates nothing either;
    // and the count works: a Vec made meanwhile is seen.
    COUNTING.with(|c| c.set(true));
    let errors = model.errors();
    let seen: Vec<u8> = Vec::with_capacity(8);
    COUNTING.with(|c| c.set(false));
    assert_eq!(ALLOCS.with(Cell::get), 1);
    drop(seen);
    assert!(errors.iter().all(|e| e.count > 0));
}



// ---- what the model ignores or mends ----

#[test]
fn empty_passes_and_instant_steps_are_not_observed() {
    let mut model = LatencyModel::new(calibrated(16));
    let before = model.coefficients();
    model.observe_pass(&StepCost::default(), Duration::from_millis(5));
    let cost = pass_of(&mut Rng::new(17), StepKind::Mixed);
    model.observe_pass(&cost, Duration::ZERO);
    model.observe_pass(&cost, Duration::from_nanos(999));
    assert!(model.errors().iter().all(|e| e.count == 0));
    assert_eq!(model.coefficients(), before);
    // An empty pass costs the fixed time, with the largest pass margin.
    let empty = model.predict_pass(&StepCost::default());
    assert!(same(empty, Duration::from_secs_f64(model.coefficients().pass.base)));
    assert!(same(model.predict_pass_with_margin(&StepCost::default()), empty.mul_f64(1.5)));
}

#[test]
fn coefficients_that_cannot_be_right_are_mended_on_start() {
    let mut c = calibrated(18);
    c.pass.decode_row = -1e-4;
    c.unit.head_row = f64::NAN;
    c.pass.adapter = f64::INFINITY;
    let model = LatencyModel::new(c);
    assert_eq!(model.offline().pass.decode_row, 0.0);
    assert_eq!(model.offline().unit.head_row, UnitCoefficients::uncalibrated().head_row);
    assert_eq!(model.offline().pass.adapter, PassCoefficients::uncalibrated().adapter);
    let cost = pass_of(&mut Rng::new(19), StepKind::Decode);
    assert!(model.predict_pass(&cost) < Duration::from_secs(1));
}
