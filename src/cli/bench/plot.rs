//! Log–log plot of median time against `T`, one line per (mixer, form, backend), as PNG and
//! SVG. Text is drawn with DejaVu Sans embedded in the binary (plotters' `ab_glyph`
//! feature), so no system font library is needed.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use mixer_core::{Error, Form, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::{Report, Status};

const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn register_font() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "the embedded DejaVu Sans font did not load".to_string())
    })
    .clone()
    .map_err(Error::Io)
}

type Series = Vec<(String, usize, Form, Vec<(f64, f64)>)>;

/// Series `(label, mixer index, form, [(T, ms)])` in report order.
fn series(r: &Report) -> Series {
    let mut mixers: Vec<String> = Vec::new();
    let mut by: BTreeMap<(String, String, Form), Vec<(f64, f64)>> = BTreeMap::new();
    let mut order = Vec::new();
    for p in &r.points {
        if !mixers.contains(&p.mixer) {
            mixers.push(p.mixer.clone());
        }
        if let (Status::Ok, Some(t)) = (p.status, &p.timing) {
            let k = (p.mixer.clone(), p.backend.clone(), p.form);
            if !by.contains_key(&k) {
                order.push(k.clone());
            }
            by.entry(k).or_default().push((p.seq as f64, t.median * 1e3));
        }
    }
    let multi_backend = r.meta.backends.len() > 1;
    order
        .into_iter()
        .map(|k| {
            let idx = mixers.iter().position(|m| *m == k.0).unwrap_or(0);
            let label = if multi_backend {
                format!("{} · {} · {}", k.0, k.2, k.1)
            } else {
                format!("{} · {}", k.0, k.2)
            };
            let pts = by[&k].clone();
            (label, idx, k.2, pts)
        })
        .collect()
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> std::result::Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let all = series(r);
    let xs = all.iter().flat_map(|s| s.3.iter().map(|p| p.0));
    let ys = all.iter().flat_map(|s| s.3.iter().map(|p| p.1));
    let (xmin, xmax) = xs.fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
    let (ymin, ymax) = ys.fold((f64::INFINITY, 0.0f64), |(a, b), y| (a.min(y), b.max(y)));
    let title = format!(
        "median time vs T (log–log), B={} H={} D={} {}, {}",
        r.meta.batch,
        r.meta.heads,
        r.meta.dim,
        r.meta.dtype,
        r.meta.backends.join("+")
    );
    if all.is_empty() {
        root.draw(&Text::new(
            format!("{title}: no measured points"),
            (20, 20),
            ("sans-serif", 20).into_font(),
        ))
        .map_err(e)?;
        return root.present().map_err(e);
    }
    let (xmin, xmax) = (xmin / 1.3, xmax * 1.3);
    let (ymin, ymax) = (ymin / 2.0, ymax * 2.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d((xmin..xmax).log_scale(), (ymin..ymax).log_scale())
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("T (tokens)")
        .y_desc("median wall time (ms)")
        .x_label_formatter(&|x| format!("{}", x.round()))
        .y_label_formatter(&|y| super::report::sig3(*y))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(e)?;
    for (label, idx, form, pts) in &all {
        let color = COLORS[idx % COLORS.len()];
        let width = match form {
            Form::Fast => 3,
            Form::Recurrent => 1,
            _ => 2,
        };
        let style = ShapeStyle::from(&color).stroke_width(width);
        chart
            .draw_series(LineSeries::new(pts.clone(), style))
            .map_err(e)?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
        let filled = color.filled();
        match form {
            Form::Fast => chart.draw_series(pts.iter().map(|&c| Circle::new(c, 5, filled))).map(|_| ()),
            Form::Parallel => {
                chart.draw_series(pts.iter().map(|&c| TriangleMarker::new(c, 6, filled))).map(|_| ())
            }
            Form::Recurrent => chart.draw_series(pts.iter().map(|&c| Cross::new(c, 5, style))).map(|_| ()),
            Form::Materialized => chart
                .draw_series(
                    pts.iter().map(|&c| EmptyElement::at(c) + Rectangle::new([(-4, -4), (4, 4)], filled)),
                )
                .map(|_| ()),
        }
        .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

/// Writes the plot as PNG and SVG.
pub fn plot(r: &Report, png: &Path, svg: &Path) -> Result<()> {
    register_font()?;
    let size = (1100, 760);
    draw(BitMapBackend::new(png, size).into_drawing_area(), r)
        .map_err(|e| Error::Io(format!("cannot draw {}: {e}", png.display())))?;
    draw(SVGBackend::new(svg, size).into_drawing_area(), r)
        .map_err(|e| Error::Io(format!("cannot draw {}: {e}", svg.display())))?;
    Ok(())
}
