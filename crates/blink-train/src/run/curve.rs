//! The loss curve in the output directory: `loss.csv` (one row per optimizer step, the
//! evaluation columns filled at each epoch's end) and `loss.svg`, a plot of both losses
//! drawn by hand (a few lines of SVG; no plotting library for one chart).

use std::fmt::Write as _;
use std::path::Path;

use crate::checkpoint::CurvePoint;

/// The CSV text of `points`.
pub fn csv(points: &[CurvePoint]) -> String {
    let mut s = String::from("step,epoch,train_loss,lr,tokens,eval_loss,eval_accuracy\n");
    let opt = |v: Option<f64>| v.map(|v| format!("{v:.6}")).unwrap_or_default();
    for p in points {
        let _ = writeln!(s, "{},{},{:.6},{:.3e},{},{},{}", p.step, p.epoch, p.train_loss, p.lr, p.tokens, opt(p.eval_loss), opt(p.eval_accuracy));
    }
    s
}

/// An SVG plot of the training loss per step (and evaluation loss where measured).
pub fn svg(points: &[CurvePoint]) -> String {
    let (w, h, pad) = (640.0, 360.0, 48.0);
    let max_step = points.iter().map(|p| p.step).max().unwrap_or(1).max(1) as f64;
    let losses = points.iter().flat_map(|p| std::iter::once(p.train_loss).chain(p.eval_loss)).filter(|v| v.is_finite());
    let max_loss = losses.fold(0.0f64, f64::max).max(1e-3) * 1.05;
    let x = |s: u64| pad + (s as f64 / max_step) * (w - 2.0 * pad);
    let y = |l: f64| h - pad - (l / max_loss) * (h - 2.0 * pad);
    let line = |pts: Vec<(u64, f64)>| pts.iter().map(|&(s, l)| format!("{:.1},{:.1}", x(s), y(l))).collect::<Vec<_>>().join(" ");
    let train = line(points.iter().filter(|p| p.train_loss.is_finite()).map(|p| (p.step, p.train_loss)).collect());
    let eval = line(points.iter().filter_map(|p| p.eval_loss.map(|l| (p.step, l))).collect());
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n");
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let _ = writeln!(s, "<line x1=\"{pad}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>", h - pad, w - pad, h - pad);
    let _ = writeln!(s, "<line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{}\" stroke=\"black\"/>", h - pad);
    let _ = writeln!(s, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">optimizer step (last {})</text>", w / 2.0, h - 12.0, max_step);
    let _ = writeln!(s, "<text x=\"12\" y=\"{}\" transform=\"rotate(-90 12 {})\" text-anchor=\"middle\">loss (top {max_loss:.2})</text>", h / 2.0, h / 2.0);
    let _ = writeln!(s, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{train}\"/>");
    if !eval.is_empty() {
        let _ = writeln!(s, "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"6 3\" points=\"{eval}\"/>");
    }
    let _ = writeln!(s, "<text x=\"{}\" y=\"{}\" fill=\"#1f77b4\">training loss</text>", w - pad - 150.0, pad);
    if !eval.is_empty() {
        let _ = writeln!(s, "<text x=\"{}\" y=\"{}\" fill=\"#d62728\">evaluation loss</text>", w - pad - 150.0, pad + 16.0);
    }
    s.push_str("</svg>\n");
    s
}

/// Write both files into `dir`.
pub fn write(dir: &Path, points: &[CurvePoint]) -> std::io::Result<()> {
    std::fs::write(dir.join("loss.csv"), csv(points))?;
    std::fs::write(dir.join("loss.svg"), svg(points))
}
