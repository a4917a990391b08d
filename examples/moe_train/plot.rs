//! Loss curves as a PNG: plotters' bitmap backend, text drawn by ab_glyph from an embedded
//! DejaVu Sans Mono (no system font or library needed).

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::FontStyle;

use burn_lowp::error::LowpError;

static FONT: &[u8] = include_bytes!("../../assets/DejaVuSansMono.ttf");

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
            .map_err(|_| ())
            .expect("the embedded font parses");
    });
}

/// One curve: a label and `(step, loss)` points.
pub struct Curve {
    pub label: String,
    pub points: Vec<(usize, f32)>,
}

/// Moving average over `window` points, which makes curves of noisy per-step losses readable.
pub fn smooth(points: &[(usize, f32)], window: usize) -> Vec<(usize, f32)> {
    let window = window.max(1);
    let mut sum = 0.0f64;
    points
        .iter()
        .enumerate()
        .map(|(i, &(step, loss))| {
            sum += loss as f64;
            if i >= window {
                sum -= points[i - window].1 as f64;
            }
            (step, (sum / window.min(i + 1) as f64) as f32)
        })
        .collect()
}

/// Draws the curves into `path` (PNG, 1024x640).
pub fn loss_curves(path: &Path, title: &str, curves: &[Curve]) -> Result<(), LowpError> {
    register_font();
    let err = |e: &dyn std::fmt::Display| LowpError::file(path, format!("drawing the loss curves: {e}"));
    let finite = || curves.iter().flat_map(|c| c.points.iter()).filter(|p| p.1.is_finite());
    let last_step = finite().map(|p| p.0).max().unwrap_or(1).max(1);
    let (lo, hi) = finite().fold((f32::MAX, f32::MIN), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let (lo, hi) = if lo <= hi { (lo, hi) } else { (0.0, 1.0) };
    let pad = ((hi - lo) * 0.05).max(1e-3);

    let root = BitMapBackend::new(path, (1024, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0..last_step, (lo - pad)..(hi + pad))
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("training loss (nats/token)")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, curve) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points = curve.points.iter().copied().filter(|p| p.1.is_finite());
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(curve.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
