//! Log–log plot of median time against `T`, one line per (mixer, form, backend), as PNG and
//! SVG. Text is drawn with DejaVu Sans embedded in the binary (plotters' `ab_glyph`
//! feature), so no system font library is needed.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use mixer_core::{Error, Form, Result};
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::format::sig3;
use super::model::{Report, Status};

pub(crate) const COLORS: [RGBColor; 10] = [
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

pub(crate) fn register_font() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "the embedded DejaVu Sans font did not load".to_string())
    })
    .clone()
    .map_err(Error::Io)
}

type Series = Vec<(String, usize, Form, Vec<(f64, f64)>)>;

/// Series `(label, mixer index, form, [(log₂ T, ms)])` in report order.
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
            by.entry(k).or_default().push(((p.seq as f64).log2(), t.median * 1e3));
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

type DrawResult<DB> = std::result::Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Draws the marker of a form (fast ●, parallel ▲, materialized ■, recurrent ✕) at `at`.
fn marker<DB: DrawingBackend, CT: CoordTranslate>(
    area: &DrawingArea<DB, CT>,
    at: CT::From,
    form: Form,
    color: RGBColor,
) -> DrawResult<DB> {
    let f = color.filled();
    match form {
        Form::Fast => area.draw(&(EmptyElement::at(at) + Circle::new((0, 0), 5, f))),
        Form::Parallel => area.draw(&(EmptyElement::at(at) + TriangleMarker::new((0, 0), 6, f))),
        Form::Materialized => area.draw(&(EmptyElement::at(at) + Rectangle::new([(-4, -4), (4, 4)], f))),
        Form::Recurrent => area.draw(&(EmptyElement::at(at) + Cross::new((0, 0), 5, color.stroke_width(2)))),
    }
}

fn style(form: Form, color: RGBColor) -> ShapeStyle {
    ShapeStyle::from(&color).stroke_width(match form {
        Form::Fast => 3,
        Form::Recurrent => 1,
        _ => 2,
    })
}

/// `T` on a log₂ axis, labelled in tokens (`512`, `4k`, `64k`).
fn tokens(log2t: f64) -> String {
    let t = log2t.exp2().round() as u64;
    if t >= 1024 && t.is_multiple_of(1024) { format!("{}k", t / 1024) } else { t.to_string() }
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> std::result::Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let all = series(r);
    let xs = all.iter().flat_map(|s| s.3.iter().map(|p| p.0));
    let ys = all.iter().flat_map(|s| s.3.iter().map(|p| p.1));
    let (xmin, xmax) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
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
    let (w, _) = root.dim_in_pixel();
    let (area, legend) = root.split_horizontally(w.saturating_sub(330));
    let (xmin, xmax) = (xmin - 0.3, xmax + 0.3);
    let (ymin, ymax) = (ymin / 2.0, ymax * 2.0);
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(xmin..xmax, (ymin..ymax).log_scale())
        .map_err(e)?;
    let ticks = (xmax.floor() - xmin.ceil()).max(0.0) as usize + 1;
    chart
        .configure_mesh()
        .x_desc("T (tokens, log scale)")
        .y_desc("median wall time (ms)")
        .x_labels(ticks)
        .x_label_formatter(&|x| if (x - x.round()).abs() < 1e-6 { tokens(*x) } else { String::new() })
        .y_label_formatter(&|y| sig3(*y))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(e)?;
    for (_, idx, form, pts) in &all {
        let color = COLORS[idx % COLORS.len()];
        chart.draw_series(LineSeries::new(pts.clone(), style(*form, color))).map_err(e)?;
        for &p in pts {
            marker(chart.plotting_area(), p, *form, color).map_err(e)?;
        }
    }
    // Legend beside the plot.
    let font = ("sans-serif", 14).into_font();
    for (i, (label, idx, form, _)) in all.iter().enumerate() {
        let color = COLORS[idx % COLORS.len()];
        let y = 50 + 20 * i as i32;
        legend.draw(&PathElement::new(vec![(8, y), (44, y)], style(*form, color))).map_err(e)?;
        marker(&legend, (26, y), *form, color).map_err(e)?;
        legend.draw(&Text::new(label.clone(), (52, y - 8), font.clone())).map_err(e)?;
    }
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
