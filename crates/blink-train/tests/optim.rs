//! AdamW, gradient clipping and the schedule, checked against values worked out by hand.

use blink_train::optim::{clip_grad_norm, grad_norm, AdamW, AdamWConfig, Decay, OptimError, Schedule};

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

#[test]
fn the_first_step_moves_every_element_by_lr_against_its_gradient() {
    // From zero moments, m̂ = g and v̂ = g², so the step is lr·g/(|g| + eps) ≈ lr·sign(g).
    let lr = 1e-3;
    let grads: Vec<f32> = (0..64).map(|i| (if i % 2 == 0 { 1.0 } else { -1.0 }) * (0.05 + 0.31 * i as f32)).collect();
    let mut params = vec![vec![0f32; grads.len()]];
    let mut opt = AdamW::new(AdamWConfig::new(lr, 0.0), &[grads.len()]).unwrap();
    opt.step(&mut params, &[&grads]).unwrap();
    assert_eq!(opt.steps(), 1);
    for (&p, &g) in params[0].iter().zip(&grads) {
        let want = -lr * f64::from(g.signum());
        assert!(close(f64::from(p), want, 1e-6 * lr), "g {g}: moved {p}, want {want}");
    }
    // A zero gradient does not move its element.
    let mut p = vec![vec![0.25f32, 0.5]];
    let mut opt = AdamW::new(AdamWConfig::new(lr, 0.0), &[2]).unwrap();
    opt.step(&mut p, &[vec![0.0f32, 3.0]]).unwrap();
    assert_eq!(p[0][0], 0.25);
}

#[test]
fn two_steps_match_the_hand_computed_values() {
    // lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.1; element 0 starts at 1.0 with
    // gradients 0.5 then -0.25; element 1 starts at 2.0 with gradient 0 both times.
    //
    // Step 1 (t = 1): decay p = 1.0·(1 - 0.1·0.1) = 0.99.
    //   m = 0.1·0.5 = 0.05;  v = 0.001·0.25 = 0.00025;
    //   m̂ = 0.05/(1 - 0.9) = 0.5;  v̂ = 0.00025/(1 - 0.999) = 0.25;  sqrt(v̂) = 0.5;
    //   p = 0.99 - 0.1·0.5/(0.5 + 1e-8) = 0.99 - 0.099999998 = 0.890000002.
    // Step 2 (t = 2): decay p = 0.890000002·0.99 = 0.88110000198.
    //   m = 0.9·0.05 + 0.1·(-0.25) = 0.045 - 0.025 = 0.02;
    //   v = 0.999·0.00025 + 0.001·0.0625 = 0.00024975 + 0.0000625 = 0.00031225;
    //   m̂ = 0.02/(1 - 0.81) = 0.02/0.19 = 0.1052631579;
    //   v̂ = 0.00031225/(1 - 0.998001) = 0.00031225/0.001999 = 0.1562031016;  sqrt(v̂) = 0.3952253807;
    //   p = 0.88110000198 - 0.1·0.1052631579/0.3952253907 = 0.88110000198 - 0.0266337033 = 0.8544662987.
    // Element 1: m = v = 0, so only the decay acts: 2.0·0.99·0.99 = 1.9602.
    let mut params = vec![vec![1.0f32, 2.0]];
    let mut opt = AdamW::new(AdamWConfig::new(0.1, 0.1), &[2]).unwrap();
    opt.step(&mut params, &[vec![0.5f32, 0.0]]).unwrap();
    assert!(close(f64::from(params[0][0]), 0.890000002, 1e-6), "{}", params[0][0]);
    let (m, v) = opt.moments(0).unwrap();
    assert!(close(f64::from(m[0]), 0.05, 1e-8) && close(f64::from(v[0]), 0.00025, 1e-10), "{m:?} {v:?}");
    opt.step(&mut params, &[vec![-0.25f32, 0.0]]).unwrap();
    assert!(close(f64::from(params[0][0]), 0.8544662987, 1e-6), "{}", params[0][0]);
    assert!(close(f64::from(params[0][1]), 1.9602, 1e-6), "{}", params[0][1]);
    let (m, v) = opt.moments(0).unwrap();
    assert!(close(f64::from(m[0]), 0.02, 1e-8) && close(f64::from(v[0]), 0.00031225, 1e-10), "{m:?} {v:?}");
    assert_eq!(opt.steps(), 2);
}

#[test]
fn weight_decay_alone_shrinks_by_lr_times_wd() {
    let (lr, wd) = (0.01, 0.1);
    let start = [1.0f32, -2.0, 0.5, 0.0];
    let mut params = vec![start.to_vec()];
    let mut opt = AdamW::new(AdamWConfig::new(lr, wd), &[4]).unwrap();
    opt.step(&mut params, &[vec![0f32; 4]]).unwrap();
    for (&p, &p0) in params[0].iter().zip(&start) {
        let want = f64::from(p0) - lr * wd * f64::from(p0);
        assert!(close(f64::from(p), want, 1e-7), "{p0} → {p}, want {want}");
    }
}

#[test]
fn restored_state_continues_identically() {
    let cfg = AdamWConfig::new(1e-2, 0.01);
    let grads = [vec![0.3f32, -0.7, 0.01], vec![1.5f32]];
    let mut a_params = vec![vec![0.1f32, 0.2, 0.3], vec![-1.0f32]];
    let mut a = AdamW::new(cfg, &[3, 1]).unwrap();
    a.step(&mut a_params, &grads).unwrap();
    let moments = |i| a.moments(i).map(|(m, v)| (m.to_vec(), v.to_vec())).unwrap();
    let ((m0, v0), (m1, v1)) = (moments(0), moments(1));
    let mut b = AdamW::from_state(cfg, a.steps(), vec![m0, m1], vec![v0, v1]).unwrap();
    let mut b_params = a_params.clone();
    a.step(&mut a_params, &grads).unwrap();
    b.step(&mut b_params, &grads).unwrap();
    assert_eq!(a_params, b_params);
}

#[test]
fn mismatched_shapes_and_bad_settings_are_errors() {
    let mut opt = AdamW::new(AdamWConfig::default(), &[2, 3]).unwrap();
    let mut params = vec![vec![0f32; 2], vec![0f32; 3]];
    assert!(matches!(opt.step(&mut params, &[vec![0f32; 2]]), Err(OptimError::Shape(_))));
    assert!(matches!(opt.step(&mut params, &[vec![0f32; 2], vec![0f32; 4]]), Err(OptimError::Shape(_))));
    assert_eq!(opt.steps(), 0, "a refused step changes nothing");
    assert!(AdamW::new(AdamWConfig { beta1: 1.0, ..AdamWConfig::default() }, &[1]).is_err());
    assert!(AdamW::new(AdamWConfig::new(f64::NAN, 0.0), &[1]).is_err());
    assert!(opt.set_lr(-1.0).is_err());
    assert!(AdamW::from_state(AdamWConfig::default(), 1, vec![vec![0.0; 2]], vec![vec![0.0; 3]]).is_err());
}

#[test]
fn clipping_scales_to_exactly_the_maximum_norm() {
    // Norm sqrt(3² + 4² + 12²) = 13; clipped to 6.5 the gradients halve.
    let mut grads = vec![vec![3.0f32, 4.0], vec![12.0f32]];
    let norm = clip_grad_norm(&mut grads, 6.5).unwrap();
    assert_eq!(norm, 13.0);
    assert_eq!(grads, [vec![1.5f32, 2.0], vec![6.0f32]]);
    assert_eq!(grad_norm(&grads), 6.5);

    let mut grads: Vec<Vec<f32>> = (0..5).map(|t| (0..97).map(|i| ((i * 7 + t * 13) % 23) as f32 - 11.3).collect()).collect();
    let before = grad_norm(&grads);
    assert_eq!(clip_grad_norm(&mut grads, 1.0).unwrap(), before);
    assert!(close(grad_norm(&grads), 1.0, 1e-6), "{}", grad_norm(&grads));
}

#[test]
fn clipping_leaves_gradients_within_the_maximum_alone() {
    let mut grads = vec![vec![3.0f32, 4.0]];
    assert_eq!(clip_grad_norm(&mut grads, 5.0).unwrap(), 5.0);
    assert_eq!(clip_grad_norm(&mut grads, 100.0).unwrap(), 5.0);
    assert_eq!(grads, [vec![3.0f32, 4.0]]);
}

#[test]
fn clipping_refuses_non_finite_gradients_and_bad_maxima() {
    let mut grads = vec![vec![1.0f32, f32::NAN]];
    assert!(matches!(clip_grad_norm(&mut grads, 1.0), Err(OptimError::NonFinite(_))));
    let mut grads = vec![vec![f32::INFINITY]];
    assert!(matches!(clip_grad_norm(&mut grads, 1.0), Err(OptimError::NonFinite(_))));
    assert_eq!(grads[0][0], f32::INFINITY);
    let mut grads = vec![vec![1.0f32]];
    for max in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(matches!(clip_grad_norm(&mut grads, max), Err(OptimError::Setting(_))), "{max}");
    }
}

#[test]
fn the_schedule_warms_up_then_decays() {
    let lr = 1e-3;
    // 10 warm-up steps in a run of 110: decay spans the 100 steps after them.
    let cos = Schedule::new(lr, 10, 110, Decay::Cosine).unwrap();
    assert_eq!(cos.lr(0), 0.0, "warm-up starts at 0");
    assert!(close(cos.lr(1), lr / 10.0, 1e-18));
    assert!(close(cos.lr(5), lr / 2.0, 1e-18));
    assert_eq!(cos.lr(10), lr, "warm-up ends at the peak");
    assert!(close(cos.lr(60), lr / 2.0, 1e-15), "mid-cosine is half the peak: {}", cos.lr(60));
    assert!(cos.lr(35) > cos.lr(60) && cos.lr(60) > cos.lr(85));
    assert_eq!(cos.lr(110), 0.0, "the decay ends at 0");
    assert_eq!(cos.lr(200), 0.0, "and stays there");

    let lin = Schedule::new(lr, 10, 110, Decay::Linear).unwrap();
    assert_eq!(lin.lr(0), 0.0);
    assert_eq!(lin.lr(10), lr);
    assert!(close(lin.lr(60), lr / 2.0, 1e-18));
    assert!(close(lin.lr(109), lr / 100.0, 1e-18));
    assert_eq!(lin.lr(110), 0.0);
    assert_eq!(lin.lr(500), 0.0);

    let constant = Schedule::new(lr, 4, 100, Decay::Constant).unwrap();
    assert_eq!(constant.lr(0), 0.0);
    assert_eq!(constant.lr(2), lr / 2.0);
    assert_eq!(constant.lr(4), lr);
    assert_eq!(constant.lr(100), lr);

    // No warm-up: the peak from the first step.
    let nw = Schedule::new(lr, 0, 50, Decay::Cosine).unwrap();
    assert_eq!(nw.lr(0), lr);
    assert!(close(nw.lr(25), lr / 2.0, 1e-15));
    assert_eq!(nw.lr(50), 0.0);
}

#[test]
fn bad_schedules_are_errors() {
    assert!(Schedule::new(1e-3, 11, 10, Decay::Linear).is_err());
    assert!(Schedule::new(1e-3, 0, 0, Decay::Constant).is_err());
    assert!(Schedule::new(-1e-3, 0, 10, Decay::Constant).is_err());
    assert!(Schedule::new(f64::INFINITY, 0, 10, Decay::Constant).is_err());
}
