//! A figure of labelled matrices side by side, drawn with the heatmap's cells, labels, colour
//! bars, font and rasteriser: `attn explain --svg/--png` draws the steps of one attention head
//! with it (scores, scaled scores, weights, the head's output).
//!
//! Unlike an attention map, the matrices may be signed (raw scores, outputs: a diverging
//! scale, blue below zero and red above, symmetric around 0), have their own row and column
//! labels and sizes, and hold `-inf` for masked entries (drawn grey, "masked" in the tooltip).
//!
//! ```no_run
//! use attn_cli::heatmap::steps::{save_steps, ColourScale, MatrixPanel};
//! # fn main() -> candle::Result<()> {
//! let panel = MatrixPanel {
//!     title: "scores".into(),
//!     rows: vec!["a".into(), "b".into()],
//!     columns: vec!["a".into(), "b".into()],
//!     values: vec![vec![1.5, f32::NEG_INFINITY], vec![-0.5, 2.0]],
//!     scale: ColourScale::Diverging,
//! };
//! save_steps("head 0", &[panel], std::path::Path::new("steps.svg"))?;
//! # Ok(()) }
//! ```

use super::{
    display_label, escape, hex, rasterise, save_svg_or_png, text_width, write_axis_labels,
    write_background_and_title, write_frame_and_bar, write_gradient, BAR_GAP, BAR_WIDTH, CELL,
    DIAG, FONT, FONT_FAMILY, INK, LABEL_GAP, MARGIN, PANEL_GAP, TITLE_FONT,
};
use candle::Result;
use std::fmt::Write as _;
use std::path::Path;

/// How a panel maps numbers to colours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColourScale {
    /// White at 0 to dark blue at the panel's largest value (weights, probabilities).
    Sequential,
    /// Blue for negative, white at 0, red for positive, symmetric: `±` the largest magnitude.
    Diverging,
}

/// One matrix to draw: `values[row][column]`, `-inf` for a masked entry.
#[derive(Clone, Debug, PartialEq)]
pub struct MatrixPanel {
    /// Shown above the panel.
    pub title: String,
    /// One label per row.
    pub rows: Vec<String>,
    /// One label per column.
    pub columns: Vec<String>,
    /// `rows.len()` rows of `columns.len()` finite numbers or `-inf`.
    pub values: Vec<Vec<f32>>,
    /// The colour scale.
    pub scale: ColourScale,
}

/// ColorBrewer "RdBu" (11 classes), reversed: blue (most negative) to red (most positive).
const DIVERGING: [[u8; 3]; 11] = [
    [5, 48, 97],
    [33, 102, 172],
    [67, 147, 195],
    [146, 197, 222],
    [209, 229, 240],
    [247, 247, 247],
    [253, 219, 199],
    [244, 165, 130],
    [214, 96, 77],
    [178, 24, 43],
    [103, 0, 31],
];

/// Fill of a masked cell.
const MASKED: &str = "#d0d0d0";

fn interpolate(scale: &[[u8; 3]], t: f64) -> [u8; 3] {
    let t = t.clamp(0.0, 1.0) * (scale.len() - 1) as f64;
    let i = (t.floor() as usize).min(scale.len() - 2);
    let f = t - i as f64;
    let (a, b) = (scale[i], scale[i + 1]);
    let mix = |k: usize| (f64::from(a[k]) + (f64::from(b[k]) - f64::from(a[k])) * f).round() as u8;
    [mix(0), mix(1), mix(2)]
}

impl MatrixPanel {
    fn check(&self) -> Result<()> {
        let (r, c) = (self.rows.len(), self.columns.len());
        if r == 0 || c == 0 {
            candle::bail!(
                "panel '{}': needs at least one row and one column, got {r} × {c}",
                self.title
            )
        }
        if self.values.len() != r || self.values.iter().any(|row| row.len() != c) {
            candle::bail!(
                "panel '{}': values must be {r} × {c} (one row per row label, one column per \
                 column label)",
                self.title
            )
        }
        if let Some(bad) = self
            .values
            .iter()
            .flatten()
            .find(|v| v.is_nan() || **v == f32::INFINITY)
        {
            candle::bail!(
                "panel '{}': value {bad}; values must be finite or -inf (masked)",
                self.title
            )
        }
        if self.scale == ColourScale::Sequential
            && self
                .values
                .iter()
                .flatten()
                .any(|&v| v.is_finite() && v < 0.0)
        {
            candle::bail!(
                "panel '{}': a sequential scale needs non-negative values",
                self.title
            )
        }
        Ok(())
    }

    /// The largest magnitude of the finite values (1 when there is none or it is 0).
    fn vmax(&self) -> f32 {
        let m = self
            .values
            .iter()
            .flatten()
            .filter(|v| v.is_finite())
            .fold(0f32, |m, v| m.max(v.abs()));
        if m > 0.0 {
            m
        } else {
            1.0
        }
    }

    fn colour(&self, v: f32, vmax: f32) -> String {
        if !v.is_finite() {
            return MASKED.to_string();
        }
        match self.scale {
            ColourScale::Sequential => hex(super::colour(v / vmax)),
            ColourScale::Diverging => hex(interpolate(
                &DIVERGING,
                0.5 + 0.5 * f64::from(v) / f64::from(vmax),
            )),
        }
    }

    /// Width and height of the panel, and where its grid starts.
    fn geometry(&self) -> PanelGeometry {
        let rows: Vec<String> = self.rows.iter().map(|s| display_label(s)).collect();
        let columns: Vec<String> = self.columns.iter().map(|s| display_label(s)).collect();
        let row_w = rows.iter().map(|s| text_width(s, FONT)).fold(0.0, f64::max);
        let col_w = columns
            .iter()
            .map(|s| text_width(s, FONT))
            .fold(0.0, f64::max);
        let rotate = col_w > CELL - 4.0;
        let col_h = if rotate {
            col_w * DIAG + FONT + LABEL_GAP
        } else {
            FONT + LABEL_GAP
        };
        let grid_x = row_w + LABEL_GAP;
        let grid_y = FONT + 10.0 + col_h;
        let grid_w = columns.len() as f64 * CELL;
        let grid_h = rows.len() as f64 * CELL;
        let (lo, hi) = self.bar_labels();
        let bar_label_w = text_width(&lo, FONT).max(text_width(&hi, FONT));
        let title_w = text_width(&self.title, FONT);
        let reach = if rotate { col_w * DIAG } else { 0.0 };
        let width = (grid_x + grid_w + (BAR_GAP + BAR_WIDTH + 4.0 + bar_label_w).max(reach))
            .max(grid_x + title_w);
        PanelGeometry {
            rows,
            columns,
            rotate,
            grid_x,
            grid_y,
            width,
            height: grid_y + grid_h.max(3.0 * FONT),
        }
    }

    fn bar_labels(&self) -> (String, String) {
        let vmax = self.vmax();
        let fmt = |v: f32| {
            if v.abs() >= 0.01 || v == 0.0 {
                format!("{v:.2}")
            } else {
                format!("{v:.1e}")
            }
        };
        match self.scale {
            ColourScale::Sequential => ("0".to_string(), fmt(vmax)),
            ColourScale::Diverging => (fmt(-vmax), fmt(vmax)),
        }
    }
}

struct PanelGeometry {
    rows: Vec<String>,
    columns: Vec<String>,
    rotate: bool,
    grid_x: f64,
    grid_y: f64,
    width: f64,
    height: f64,
}

/// Draws `panels` left to right under `title` as an SVG document. Errors on a malformed panel
/// (no rows or columns, values not `rows × columns`, NaN or `+inf`, negative values on a
/// sequential scale) or when there is no panel.
pub fn render_steps_svg(title: &str, panels: &[MatrixPanel]) -> Result<String> {
    if panels.is_empty() {
        candle::bail!("a steps figure needs at least one panel")
    }
    for p in panels {
        p.check()?;
    }
    let geometry: Vec<PanelGeometry> = panels.iter().map(MatrixPanel::geometry).collect();
    let title_h = TITLE_FONT + 14.0;
    let panels_w: f64 =
        geometry.iter().map(|g| g.width).sum::<f64>() + PANEL_GAP * (panels.len() - 1) as f64;
    let width = (panels_w.max(text_width(title, TITLE_FONT)) + 2.0 * MARGIN).ceil();
    let height =
        (title_h + geometry.iter().map(|g| g.height).fold(0.0, f64::max) + 2.0 * MARGIN).ceil();
    let mut svg = String::new();
    write_svg(&mut svg, title, panels, &geometry, width, height, title_h)
        .map_err(|e| candle::Error::Msg(format!("steps figure: formatting the SVG: {e}")))?;
    Ok(svg)
}

fn write_svg(
    out: &mut String,
    title: &str,
    panels: &[MatrixPanel],
    geometry: &[PanelGeometry],
    w: f64,
    h: f64,
    title_h: f64,
) -> std::fmt::Result {
    writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="{FONT_FAMILY}" font-size="{FONT}">"#
    )?;
    writeln!(out, "<defs>")?;
    write_gradient(out, "scale-sequential", &super::SCALE)?;
    write_gradient(out, "scale-diverging", &DIVERGING)?;
    writeln!(out, "</defs>")?;
    write_background_and_title(out, (w, h), title)?;
    let mut x = MARGIN;
    for (panel, g) in panels.iter().zip(geometry) {
        write_panel(out, panel, g, (x, MARGIN + title_h))?;
        x += g.width + PANEL_GAP;
    }
    writeln!(out, "</svg>")
}

fn write_panel(
    out: &mut String,
    panel: &MatrixPanel,
    g: &PanelGeometry,
    (ox, oy): (f64, f64),
) -> std::fmt::Result {
    let (gx, gy) = (g.grid_x, g.grid_y);
    let grid_w = g.columns.len() as f64 * CELL;
    let grid_h = g.rows.len() as f64 * CELL;
    let vmax = panel.vmax();
    writeln!(
        out,
        r#"<g class="panel" transform="translate({ox:.1} {oy:.1})">"#
    )?;
    writeln!(
        out,
        r#"<text class="panel-title" x="{gx:.1}" y="{FONT}" fill="{INK}">{}</text>"#,
        escape(&panel.title)
    )?;
    write_axis_labels(
        out,
        ("column-labels", &g.columns),
        ("row-labels", &g.rows),
        (gx, gy),
        g.rotate,
    )?;
    for (i, row) in panel.values.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            let tip = if v.is_finite() {
                format!("{v:.3}")
            } else {
                "masked (-inf)".to_string()
            };
            writeln!(
                out,
                r##"<rect class="cell" x="{:.1}" y="{:.1}" width="{CELL}" height="{CELL}" fill="{}" stroke="#ffffff" stroke-width="0.5"><title>{} · {}: {}</title></rect>"##,
                gx + j as f64 * CELL,
                gy + i as f64 * CELL,
                panel.colour(v, vmax),
                escape(&g.rows[i]),
                escape(&g.columns[j]),
                tip
            )?;
        }
    }
    let gradient = match panel.scale {
        ColourScale::Sequential => "scale-sequential",
        ColourScale::Diverging => "scale-diverging",
    };
    let (lo, hi) = panel.bar_labels();
    write_frame_and_bar(
        out,
        (gx, gy),
        (grid_w, grid_h),
        grid_h.max(3.0 * FONT),
        gradient,
        (&hi, &lo),
    )?;
    writeln!(out, "</g>")
}

/// [`render_steps_svg`] rasterised to PNG with the embedded font (as the heatmaps are).
pub fn render_steps_png(title: &str, panels: &[MatrixPanel]) -> Result<Vec<u8>> {
    rasterise(&render_steps_svg(title, panels)?)
}

/// Draws the figure into `path`, SVG or PNG by the extension (`.svg`, `.png`, any case).
pub fn save_steps(title: &str, panels: &[MatrixPanel], path: &Path) -> Result<()> {
    save_svg_or_png(
        path,
        "figure",
        || render_steps_svg(title, panels),
        || render_steps_png(title, panels),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panel(scale: ColourScale, values: Vec<Vec<f32>>) -> MatrixPanel {
        MatrixPanel {
            title: "p <1>".into(),
            rows: vec!["a".into(), "b".into()],
            columns: vec!["x".into(), "y".into()],
            values,
            scale,
        }
    }

    #[test]
    fn masked_cells_are_grey_and_signs_get_opposite_colours() {
        let p = panel(
            ColourScale::Diverging,
            vec![vec![2.0, f32::NEG_INFINITY], vec![-2.0, 0.0]],
        );
        let svg = render_steps_svg("t", &[p.clone(), p]).unwrap();
        assert_eq!(svg.matches("class=\"panel\"").count(), 2);
        assert!(svg.contains(MASKED) && svg.contains("masked (-inf)"));
        assert!(
            svg.contains(&hex(DIVERGING[10])),
            "most positive is dark red"
        );
        assert!(
            svg.contains(&hex(DIVERGING[0])),
            "most negative is dark blue"
        );
        assert!(svg.contains("p &lt;1&gt;"), "titles are escaped");
    }

    #[test]
    fn malformed_panels_are_errors() {
        let ragged = panel(ColourScale::Sequential, vec![vec![0.5], vec![0.1, 0.2]]);
        assert!(render_steps_svg("t", &[ragged]).is_err());
        let negative = panel(
            ColourScale::Sequential,
            vec![vec![-0.5, 0.0], vec![0.1, 0.2]],
        );
        assert!(render_steps_svg("t", &[negative]).is_err());
        let nan = panel(
            ColourScale::Diverging,
            vec![vec![f32::NAN, 0.0], vec![0.1, 0.2]],
        );
        assert!(render_steps_svg("t", &[nan]).is_err());
        assert!(render_steps_svg("t", &[]).is_err());
    }

    #[test]
    fn png_is_a_png() {
        let p = panel(
            ColourScale::Sequential,
            vec![vec![0.5, 0.5], vec![0.9, 0.1]],
        );
        let png = render_steps_png("t", &[p]).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
}
