//! Loss and accuracy curves of a run (training loss per step, test loss and accuracy per
//! evaluation) as SVG or PNG, drawn with the same plotters setup as `mixers bench`.

use std::path::Path;

use mixer_core::{Error, Result};
use mixers_train::TrainLog;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::bench::plot::{COLORS, register_font};

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, log: &TrainLog) -> std::result::Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (top, bottom) = root.split_vertically(380);
    let steps = log.steps.len().max(1) as f64;
    let c = &log.config;
    let title = format!(
        "{} on {} (D={}, {} layers, seed {})",
        c.mixer,
        c.task.task.name(),
        c.width,
        c.layers,
        c.seed
    );
    // Loss (log scale): training per step (thin), test per evaluation (thick).
    let train: Vec<(f64, f64)> = log.steps.iter().map(|s| (s.step as f64, s.loss.max(1e-6))).collect();
    let test: Vec<(f64, f64)> = log.evals.iter().map(|v| (v.step as f64, v.test.loss.max(1e-6))).collect();
    let (lo, hi) =
        train.iter().chain(&test).fold((f64::INFINITY, 0.0f64), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (lo, hi) = if lo.is_finite() { (lo / 1.5, hi * 1.5) } else { (1e-3, 10.0) };
    let mut chart = ChartBuilder::on(&top)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .margin_right(28)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..steps, (lo..hi).log_scale())
        .map_err(e)?;
    chart
        .configure_mesh()
        .y_desc("cross-entropy")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(e)?;
    chart
        .draw_series(LineSeries::new(train, ShapeStyle::from(&COLORS[0].mix(0.5)).stroke_width(1)))
        .map_err(e)?
        .label("train loss")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], COLORS[0]));
    chart
        .draw_series(LineSeries::new(test, ShapeStyle::from(&COLORS[1]).stroke_width(3)))
        .map_err(e)?
        .label("test loss")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], COLORS[1]));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    // Accuracy.
    let mut acc = ChartBuilder::on(&bottom)
        .margin(12)
        .margin_right(28)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..steps, 0.0..1.0)
        .map_err(e)?;
    acc.configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("accuracy")
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(e)?;
    let tr: Vec<(f64, f64)> = log.steps.iter().map(|s| (s.step as f64, s.accuracy)).collect();
    let series: [(&str, Vec<(f64, f64)>, RGBColor, u32); 3] = [
        ("train accuracy", tr, COLORS[0], 1),
        ("test accuracy", log.evals.iter().map(|v| (v.step as f64, v.test.accuracy)).collect(), COLORS[2], 3),
        (
            "test sequence accuracy",
            log.evals.iter().map(|v| (v.step as f64, v.test.sequence_accuracy)).collect(),
            COLORS[3],
            2,
        ),
    ];
    for (label, pts, color, w) in series {
        let style = ShapeStyle::from(&color.mix(if w == 1 { 0.5 } else { 1.0 })).stroke_width(w);
        acc.draw_series(LineSeries::new(pts, style))
            .map_err(e)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    acc.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

/// Writes the curves to `path`: PNG when it ends in `.png`, else SVG.
pub fn plot(log: &TrainLog, path: &Path) -> Result<()> {
    register_font()?;
    let size = (900, 700);
    let r = if path.extension().is_some_and(|x| x.eq_ignore_ascii_case("png")) {
        draw(BitMapBackend::new(path, size).into_drawing_area(), log)
    } else {
        draw(SVGBackend::new(path, size).into_drawing_area(), log)
    };
    r.map_err(|e| Error::Io(format!("cannot draw {}: {e}", path.display())))
}
