//! Gradient clipping by the global L2 norm over all tensors, as `clip_grad_norm_` in
//! PyTorch, except that a clipped gradient's norm becomes exactly the maximum (scale
//! `max / norm`, with no added epsilon) and nothing is touched when it is already within it.
//!
//! The squares are summed in f64, tensor by tensor and element by element in order, so the
//! norm does not depend on threads or chunking.

use super::OptimError;

/// The global L2 norm of `grads` (f64 accumulation in a fixed order).
pub fn grad_norm<G: AsRef<[f32]>>(grads: &[G]) -> f64 {
    let mut sum = 0f64;
    for g in grads {
        add_squares(&mut sum, g.as_ref());
    }
    sum.sqrt()
}

/// Adds the squares of `g` to `sum`, element by element in order (a norm taken a few
/// tensors at a time gives the bits of [`grad_norm`]).
pub fn add_squares(sum: &mut f64, g: &[f32]) {
    for &x in g {
        let x = f64::from(x);
        *sum += x * x;
    }
}

/// Scales all of `grads` by `max_norm / norm` when their global norm is above `max_norm`;
/// returns the norm before clipping. A non-finite norm is an error and leaves the
/// gradients as they were.
pub fn clip_grad_norm<G: AsMut<[f32]> + AsRef<[f32]>>(grads: &mut [G], max_norm: f64) -> Result<f64, OptimError> {
    let norm = grad_norm(grads);
    if let Some(scale) = clip_scale(norm, max_norm)? {
        for g in grads.iter_mut() {
            g.as_mut().iter_mut().for_each(|x| *x *= scale);
        }
    }
    Ok(norm)
}

/// The factor that clips gradients of global norm `norm` to `max_norm` (`None`: within
/// it already). A maximum that is not a positive number, or a norm that is not finite, is
/// an error.
pub fn clip_scale(norm: f64, max_norm: f64) -> Result<Option<f32>, OptimError> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(OptimError::Setting(format!("the maximum gradient norm is {max_norm}")));
    }
    if !norm.is_finite() {
        return Err(OptimError::NonFinite(norm));
    }
    Ok((norm > max_norm).then(|| (max_norm / norm) as f32))
}
