//! Attention heatmaps for the translation task: the cross-attention weights of one translation
//! drawn as a grid, source tokens as columns along the top, output tokens as rows on the left.
//!
//! [`render_svg`] writes a self-contained SVG; [`render_png`] rasterises that same SVG with
//! `resvg` at twice its size ([`PNG_SCALE`]), using the DejaVu Sans font embedded in the binary
//! (no system fonts are read, so the picture is the same on every machine); [`save`] picks the
//! format from the file extension.
//!
//! Every panel has its own colour scale, from white (weight 0) to dark blue (the largest weight
//! in that panel, or 1 when the panel is all zeros), and a colour bar labelled with both ends.
//! Heads are numbered from 0, as in [`Heads::One`]; layers are shown 1-based (`layer 2/2` is the
//! last of two).
//!
//! ```no_run
//! use attn_cli::heatmap::{save, AttentionMap, Heads};
//! # fn main() -> candle::Result<()> {
//! let map = AttentionMap {
//!     source: vec!["two".into(), "hundred".into()],
//!     output: vec!["zwei".into(), "hundert".into(), "</s>".into()],
//!     weights: vec![vec![vec![0.9, 0.1], vec![0.2, 0.8], vec![0.5, 0.5]]],
//!     layer: 1,
//!     num_layers: 2,
//! };
//! save(&map, Heads::Average, std::path::Path::new("attention.png"))?;
//! # Ok(()) }
//! ```

pub mod steps;

use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use candle::Result;
use resvg::tiny_skia;
use resvg::usvg;

/// Cross-attention weights of one translation: the library's record, which both the number
/// translator and the MarianMT translator return.
pub use candle_attention::explain::AttentionMap;

/// Which heads to draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heads {
    /// One panel with the mean of the weights over all heads.
    Average,
    /// One panel per head, in a grid of up to four panels per row, each titled `head i`.
    All,
    /// One panel with head `i` (0-based) alone.
    One(usize),
}

/// The PNG is rasterised at this multiple of the SVG's size, so that 13 px text stays crisp.
/// Pictures that would exceed 40 megapixels at this scale are rasterised at scale 1 instead.
pub const PNG_SCALE: f32 = 2.0;

/// The most pixels a rasterised heatmap may have (160 MB of RGBA).
const MAX_PNG_PIXELS: f64 = 40_000_000.0;
/// Side of one cell, in px.
const CELL: f64 = 32.0;
/// Font size of the labels, in px.
const FONT: f64 = 13.0;
/// Font size of the figure title, in px.
const TITLE_FONT: f64 = 15.0;
/// Estimated advance of a non-ASCII glyph of DejaVu Sans (ä, ö, ü, ß, ...), in em.
const CHAR_WIDTH: f64 = 0.66;
/// Outer margin of the figure.
const MARGIN: f64 = 16.0;
/// Space between panels.
const PANEL_GAP: f64 = 32.0;
/// Panels per row with [`Heads::All`].
const PANELS_PER_ROW: usize = 4;
/// Space between a label and the grid.
const LABEL_GAP: f64 = 6.0;
/// Space between the grid and the colour bar, and the bar's width.
const BAR_GAP: f64 = 14.0;
const BAR_WIDTH: f64 = 12.0;
/// Labels longer than this many characters are cut, with an ellipsis.
const MAX_LABEL_CHARS: usize = 30;
/// sin 45° = cos 45°, for the rotated column labels.
const DIAG: f64 = std::f64::consts::FRAC_1_SQRT_2;
/// Font family of every text: the embedded DejaVu Sans first, for browsers a fallback.
const FONT_FAMILY: &str = "'DejaVu Sans', sans-serif";
/// Colour of the text.
const INK: &str = "#1a1a1a";
/// The sequential colour scale (ColorBrewer "Blues", 9 classes): weight 0 to the panel maximum.
const SCALE: [[u8; 3]; 9] = [
    [247, 251, 255],
    [222, 235, 247],
    [198, 219, 239],
    [158, 202, 225],
    [107, 174, 214],
    [66, 146, 198],
    [33, 113, 181],
    [8, 81, 156],
    [8, 48, 107],
];

/// Draws the cross-attention `map` as an SVG document (UTF-8 text).
///
/// Errors when the map is malformed (no heads, no source or output tokens, a head whose shape
/// is not `output.len() × source.len()`, a NaN, infinite or negative weight, `layer` not below
/// `num_layers`) or when `heads` is [`Heads::One`] with an index out of range.
pub fn render_svg(map: &AttentionMap, heads: Heads) -> Result<String> {
    let figure = Figure::plan(map, heads)?;
    let mut svg = String::new();
    figure
        .write_svg(&mut svg)
        .map_err(|e| candle::Error::Msg(format!("attention heatmap: formatting the SVG: {e}")))?;
    Ok(svg)
}

/// Draws the cross-attention `map` as a PNG image: the SVG of [`render_svg`], rasterised with
/// `resvg` at [`PNG_SCALE`] times its size on a white background, with the embedded DejaVu Sans.
///
/// Errors as [`render_svg`] does, and when the picture is too large to rasterise.
pub fn render_png(map: &AttentionMap, heads: Heads) -> Result<Vec<u8>> {
    let svg = render_svg(map, heads)?;
    rasterise(&svg)
}

/// Draws the cross-attention `map` into the file at `path`, as SVG or PNG by the extension
/// (`.svg` or `.png`, in any case).
///
/// Errors on any other extension (naming it and the two supported ones), as [`render_svg`] and
/// [`render_png`] do, and when the file cannot be written.
pub fn save(map: &AttentionMap, heads: Heads, path: &Path) -> Result<()> {
    save_svg_or_png(
        path,
        "heatmap",
        || render_svg(map, heads),
        || render_png(map, heads),
    )
}

/// Writes a figure to `path` as SVG or PNG by its extension (`.svg`, `.png`, any case); the
/// errors name the file, the `what` ("heatmap", "figure") and the supported extensions. Shared
/// by the heatmaps and the step figures of `attn explain` ([`steps`]).
pub(crate) fn save_svg_or_png(
    path: &Path,
    what: &str,
    svg: impl FnOnce() -> Result<String>,
    png: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<()> {
    let Some(ext) = path.extension() else {
        candle::bail!(
            "cannot tell the {what} format of {}: it has no extension; use .svg or .png",
            path.display()
        )
    };
    let ext_text = ext.to_string_lossy();
    let bytes = match ext_text.to_ascii_lowercase().as_str() {
        "svg" => svg()?.into_bytes(),
        "png" => png()?,
        _ => candle::bail!(
            "unsupported {what} file extension .{ext_text} in {}: use .svg or .png",
            path.display()
        ),
    };
    std::fs::write(path, bytes).map_err(|e| {
        candle::Error::Msg(format!(
            "cannot write the {what} to {}: {e}",
            path.display()
        ))
    })
}

/// Checks the shape and values of `map`.
fn validate(map: &AttentionMap) -> Result<()> {
    if map.source.is_empty() {
        candle::bail!("attention heatmap: no source tokens (need at least one column)")
    }
    if map.output.is_empty() {
        candle::bail!("attention heatmap: no output tokens (need at least one row)")
    }
    if map.weights.is_empty() {
        candle::bail!("attention heatmap: no heads (weights is empty; need at least one head)")
    }
    if map.layer >= map.num_layers {
        candle::bail!(
            "attention heatmap: layer {} (0-based) is out of range for {} layers",
            map.layer,
            map.num_layers
        )
    }
    let (rows, cols) = (map.output.len(), map.source.len());
    for (h, head) in map.weights.iter().enumerate() {
        if head.len() != rows {
            candle::bail!(
                "attention heatmap: head {h} has {} rows of weights, expected {rows} \
                 (one per output token; weights must be {rows} × {cols})",
                head.len()
            )
        }
        for (t, row) in head.iter().enumerate() {
            if row.len() != cols {
                candle::bail!(
                    "attention heatmap: head {h}, row {t} (output token {:?}) has {} weights, \
                     expected {cols} (one per source token; weights must be {rows} × {cols})",
                    map.output[t],
                    row.len()
                )
            }
            for (s, &w) in row.iter().enumerate() {
                if !w.is_finite() || w < 0.0 {
                    candle::bail!(
                        "attention heatmap: head {h}, row {t} (output token {:?}), column {s} \
                         (source token {:?}) has weight {w}; weights must be finite and \
                         non-negative",
                        map.output[t],
                        map.source[s]
                    )
                }
            }
        }
    }
    Ok(())
}

/// One panel to draw: a matrix of weights `[t][s]`, its colour-scale maximum, an optional title.
#[derive(Debug)]
struct Panel {
    title: Option<String>,
    values: Vec<Vec<f32>>,
    vmax: f32,
}

impl Panel {
    fn new(title: Option<String>, values: Vec<Vec<f32>>) -> Self {
        let max = values.iter().flatten().fold(0.0f32, |m, &v| m.max(v));
        let vmax = if max > 0.0 { max } else { 1.0 };
        Self {
            title,
            values,
            vmax,
        }
    }
}

/// The geometry of a figure: the panels, where each goes, and the layout shared by all of them
/// (they all have the same tokens). Coordinates are SVG px; panel coordinates are relative to the
/// panel's origin.
#[derive(Debug)]
struct Figure {
    title: String,
    source: Vec<String>,
    output: Vec<String>,
    panels: Vec<Panel>,
    /// Top-left corner of each panel, in figure coordinates.
    origins: Vec<(f64, f64)>,
    width: f64,
    height: f64,
    /// Left edge of the grid within a panel.
    grid_x: f64,
    /// Top edge of the grid within a panel.
    grid_y: f64,
    /// Whether the column labels are rotated by -45°.
    rotate_columns: bool,
    /// Height of the colour bar.
    bar_height: f64,
}

impl Figure {
    fn plan(map: &AttentionMap, heads: Heads) -> Result<Self> {
        validate(map)?;
        let h_count = map.weights.len();
        let layer = format!(
            "cross-attention, layer {}/{}",
            map.layer + 1,
            map.num_layers
        );
        let (title, panels) = match heads {
            Heads::Average => {
                let mut mean = vec![vec![0f32; map.source.len()]; map.output.len()];
                for head in &map.weights {
                    for (acc, row) in mean.iter_mut().zip(head) {
                        for (a, &w) in acc.iter_mut().zip(row) {
                            *a += w;
                        }
                    }
                }
                let n = h_count as f32;
                mean.iter_mut().flatten().for_each(|a| *a /= n);
                let what = if h_count == 1 {
                    "1 head".to_string()
                } else {
                    format!("mean of {h_count} heads")
                };
                (format!("{layer}, {what}"), vec![Panel::new(None, mean)])
            }
            Heads::All => {
                let panels = map
                    .weights
                    .iter()
                    .enumerate()
                    .map(|(h, w)| Panel::new(Some(format!("head {h}")), w.clone()))
                    .collect();
                let what = if h_count == 1 {
                    "1 head".to_string()
                } else {
                    format!("all {h_count} heads")
                };
                (format!("{layer}, {what}"), panels)
            }
            Heads::One(i) => {
                let Some(w) = map.weights.get(i) else {
                    candle::bail!(
                        "attention heatmap: head {i} is out of range: the map has {h_count} \
                         head{} (0..={})",
                        if h_count == 1 { "" } else { "s" },
                        h_count - 1
                    )
                };
                (
                    format!("{layer}, head {i} of {h_count} (0-based)"),
                    vec![Panel::new(None, w.clone())],
                )
            }
        };

        let source: Vec<String> = map.source.iter().map(|s| display_label(s)).collect();
        let output: Vec<String> = map.output.iter().map(|s| display_label(s)).collect();
        let (rows, cols) = (output.len() as f64, source.len() as f64);
        let (grid_w, grid_h) = (cols * CELL, rows * CELL);

        let row_label_w = output
            .iter()
            .map(|s| text_width(s, FONT))
            .fold(0.0, f64::max);
        let col_widths: Vec<f64> = source.iter().map(|s| text_width(s, FONT)).collect();
        let col_label_w = col_widths.iter().copied().fold(0.0, f64::max);
        let rotate_columns = col_label_w > CELL - 4.0;
        // Height taken by the column labels above the grid, and how far the rotated ones reach
        // past the grid's right edge.
        let (col_label_h, overflow_right) = if rotate_columns {
            let reach = col_widths
                .iter()
                .enumerate()
                .map(|(j, w)| (j as f64 + 0.5) * CELL + w * DIAG + 0.5 * FONT - grid_w)
                .fold(0.0, f64::max);
            (col_label_w * DIAG + FONT + LABEL_GAP, reach)
        } else {
            (FONT + LABEL_GAP, 0.0)
        };
        let bar_label_w = panels
            .iter()
            .map(|p| text_width(&format_value(p.vmax), FONT))
            .fold(0.0, f64::max);
        let bar_extent = BAR_GAP + BAR_WIDTH + 4.0 + bar_label_w;
        let panel_title_h = if panels.iter().any(|p| p.title.is_some()) {
            FONT + 10.0
        } else {
            0.0
        };
        let bar_height = grid_h.max(3.0 * FONT);

        let grid_x = row_label_w + LABEL_GAP;
        let grid_y = panel_title_h + col_label_h;
        let panel_w = grid_x + grid_w + overflow_right.max(bar_extent);
        let panel_h = grid_y + bar_height;

        let per_row = panels.len().min(PANELS_PER_ROW);
        let title_h = TITLE_FONT + 14.0;
        let mut origins = Vec::with_capacity(panels.len());
        for k in 0..panels.len() {
            let (r, c) = ((k / PANELS_PER_ROW) as f64, (k % PANELS_PER_ROW) as f64);
            origins.push((
                MARGIN + c * (panel_w + PANEL_GAP),
                MARGIN + title_h + r * (panel_h + PANEL_GAP),
            ));
        }
        let panel_rows = panels.len().div_ceil(PANELS_PER_ROW) as f64;
        let panels_w = per_row as f64 * panel_w + (per_row as f64 - 1.0) * PANEL_GAP;
        let width = (panels_w.max(text_width(&title, TITLE_FONT)) + 2.0 * MARGIN).ceil();
        let height =
            (title_h + panel_rows * panel_h + (panel_rows - 1.0) * PANEL_GAP + 2.0 * MARGIN).ceil();

        Ok(Self {
            title,
            source,
            output,
            panels,
            origins,
            width,
            height,
            grid_x,
            grid_y,
            rotate_columns,
            bar_height,
        })
    }

    /// Centre of cell (`t`, `s`) of panel `k`, in figure coordinates.
    #[cfg(test)]
    fn cell_centre(&self, k: usize, t: usize, s: usize) -> (f64, f64) {
        let (ox, oy) = self.origins[k];
        (
            ox + self.grid_x + (s as f64 + 0.5) * CELL,
            oy + self.grid_y + (t as f64 + 0.5) * CELL,
        )
    }

    fn write_svg(&self, out: &mut String) -> std::fmt::Result {
        let (w, h) = (self.width, self.height);
        writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="{FONT_FAMILY}" font-size="{FONT}">"#
        )?;
        writeln!(out, "<defs>")?;
        write_gradient(out, "attention-scale", &SCALE)?;
        writeln!(out, "</defs>")?;
        write_background_and_title(out, (w, h), &self.title)?;
        for (panel, origin) in self.panels.iter().zip(&self.origins) {
            self.write_panel(out, panel, *origin)?;
        }
        writeln!(out, "</svg>")
    }

    fn write_panel(
        &self,
        out: &mut String,
        panel: &Panel,
        (ox, oy): (f64, f64),
    ) -> std::fmt::Result {
        let (gx, gy) = (self.grid_x, self.grid_y);
        let grid_w = self.source.len() as f64 * CELL;
        let grid_h = self.output.len() as f64 * CELL;
        writeln!(
            out,
            r#"<g class="panel" transform="translate({ox:.1} {oy:.1})">"#
        )?;
        if let Some(title) = &panel.title {
            writeln!(
                out,
                r#"<text class="panel-title" x="{:.1}" y="{FONT}" fill="{INK}">{}</text>"#,
                gx,
                escape(title)
            )?;
        }

        // Column labels (source tokens) along the top, row labels (output tokens) on the left.
        write_axis_labels(
            out,
            ("source-labels", &self.source),
            ("output-labels", &self.output),
            (gx, gy),
            self.rotate_columns,
        )?;

        // The cells, each with a tooltip for SVG viewers.
        for (i, row) in panel.values.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                writeln!(
                    out,
                    r##"<rect class="cell" x="{:.1}" y="{:.1}" width="{CELL}" height="{CELL}" fill="{}" stroke="#ffffff" stroke-width="0.5"><title>{} ← {}: {:.3}</title></rect>"##,
                    gx + j as f64 * CELL,
                    gy + i as f64 * CELL,
                    hex(colour(v / panel.vmax)),
                    escape(&self.output[i]),
                    escape(&self.source[j]),
                    v
                )?;
            }
        }
        // The colour bar, 0 at the bottom, the panel maximum at the top.
        write_frame_and_bar(
            out,
            (gx, gy),
            (grid_w, grid_h),
            self.bar_height,
            "attention-scale",
            (&format_value(panel.vmax), "0"),
        )?;
        writeln!(out, "</g>")
    }
}

/// The labels of a grid of cells whose top-left corner is at `(gx, gy)`: `columns` along the
/// top (rotated by 45° when `rotate`, so that long tokens do not overlap), `rows` on the left,
/// each in a `<g>` of the given class. Shared by the attention heatmaps and the step figures
/// of `attn explain` ([`steps`]).
pub(crate) fn write_axis_labels(
    out: &mut String,
    (column_class, columns): (&str, &[String]),
    (row_class, rows): (&str, &[String]),
    (gx, gy): (f64, f64),
    rotate: bool,
) -> std::fmt::Result {
    writeln!(out, r#"<g class="{column_class}" fill="{INK}">"#)?;
    for (j, label) in columns.iter().enumerate() {
        let cx = gx + (j as f64 + 0.5) * CELL;
        let y = gy - LABEL_GAP;
        if rotate {
            // Baseline from (cx, y) up to the right; shifted so the glyphs sit centred on that
            // line.
            writeln!(
                out,
                r#"<text x="{cx:.1}" y="{:.1}" transform="rotate(-45 {cx:.1} {y:.1})">{}</text>"#,
                y + 0.35 * FONT,
                escape(label)
            )?;
        } else {
            writeln!(
                out,
                r#"<text x="{cx:.1}" y="{y:.1}" text-anchor="middle">{}</text>"#,
                escape(label)
            )?;
        }
    }
    writeln!(out, "</g>")?;
    writeln!(out, r#"<g class="{row_class}" fill="{INK}">"#)?;
    for (i, label) in rows.iter().enumerate() {
        writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            gx - LABEL_GAP,
            gy + (i as f64 + 0.5) * CELL + 0.35 * FONT,
            escape(label)
        )?;
    }
    writeln!(out, "</g>")
}

/// A vertical `<linearGradient id="{id}">` through the colours of `scale` (bottom to top),
/// for the colour bars.
pub(crate) fn write_gradient(out: &mut String, id: &str, scale: &[[u8; 3]]) -> std::fmt::Result {
    writeln!(
        out,
        r#"<linearGradient id="{id}" x1="0" y1="1" x2="0" y2="0">"#
    )?;
    let last = (scale.len() - 1) as f64;
    for (i, c) in scale.iter().enumerate() {
        writeln!(
            out,
            r#"<stop offset="{:.4}" stop-color="{}"/>"#,
            i as f64 / last,
            hex(*c)
        )?;
    }
    writeln!(out, "</linearGradient>")
}

/// The white background of a `w × h` figure and its title at the top left.
pub(crate) fn write_background_and_title(
    out: &mut String,
    (w, h): (f64, f64),
    title: &str,
) -> std::fmt::Result {
    writeln!(
        out,
        r##"<rect class="background" x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>"##
    )?;
    writeln!(
        out,
        r#"<text class="title" x="{MARGIN}" y="{:.1}" font-size="{TITLE_FONT}" fill="{INK}">{}</text>"#,
        MARGIN + TITLE_FONT,
        escape(title)
    )
}

/// The frame around a `grid_w × grid_h` grid of cells at `(gx, gy)`, and to its right a colour
/// bar `bar_h` high filled with the gradient `gradient`, labelled `hi` at the top and `lo` at
/// the bottom.
pub(crate) fn write_frame_and_bar(
    out: &mut String,
    (gx, gy): (f64, f64),
    (grid_w, grid_h): (f64, f64),
    bar_h: f64,
    gradient: &str,
    (hi, lo): (&str, &str),
) -> std::fmt::Result {
    writeln!(
        out,
        r##"<rect class="frame" x="{gx:.1}" y="{gy:.1}" width="{grid_w}" height="{grid_h}" fill="none" stroke="#9a9a9a" stroke-width="1"/>"##
    )?;
    let bx = gx + grid_w + BAR_GAP;
    writeln!(
        out,
        r##"<rect class="colour-bar" x="{bx:.1}" y="{gy:.1}" width="{BAR_WIDTH}" height="{bar_h:.1}" fill="url(#{gradient})" stroke="#9a9a9a" stroke-width="1"/>"##
    )?;
    let lx = bx + BAR_WIDTH + 4.0;
    writeln!(
        out,
        r#"<text class="colour-bar-label" x="{lx:.1}" y="{:.1}" fill="{INK}">{}</text>"#,
        gy + 0.75 * FONT,
        escape(hi)
    )?;
    writeln!(
        out,
        r#"<text class="colour-bar-label" x="{lx:.1}" y="{:.1}" fill="{INK}">{}</text>"#,
        gy + bar_h,
        escape(lo)
    )
}

/// The embedded font database: DejaVu Sans only, also standing in for `sans-serif`.
fn font_database() -> Arc<usvg::fontdb::Database> {
    static DB: OnceLock<Arc<usvg::fontdb::Database>> = OnceLock::new();
    DB.get_or_init(|| {
        let mut db = usvg::fontdb::Database::new();
        db.load_font_source(usvg::fontdb::Source::Binary(Arc::new(
            dejavu::sans::regular(),
        )));
        db.set_sans_serif_family("DejaVu Sans");
        Arc::new(db)
    })
    .clone()
}

/// Rasterises an SVG produced by [`render_svg`] to PNG bytes.
fn rasterise(svg: &str) -> Result<Vec<u8>> {
    let options = usvg::Options {
        font_family: "DejaVu Sans".to_string(),
        fontdb: font_database(),
        ..usvg::Options::default()
    };
    let tree = usvg::Tree::from_str(svg, &options)
        .map_err(|e| candle::Error::Msg(format!("attention heatmap: parsing the SVG: {e}")))?;
    let size = tree.size();
    let (w, h) = (f64::from(size.width()), f64::from(size.height()));
    let scale = if w * h * f64::from(PNG_SCALE * PNG_SCALE) <= MAX_PNG_PIXELS {
        PNG_SCALE
    } else if w * h <= MAX_PNG_PIXELS {
        1.0
    } else {
        candle::bail!(
            "attention heatmap is too large to rasterise ({w} × {h} px); save it as .svg instead"
        )
    };
    let (pw, ph) = (
        (w * f64::from(scale)).ceil() as u32,
        (h * f64::from(scale)).ceil() as u32,
    );
    let Some(mut pixmap) = tiny_skia::Pixmap::new(pw, ph) else {
        candle::bail!("attention heatmap: cannot allocate a {pw} × {ph} px image")
    };
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(
        &tree,
        tiny_skia::Transform::from_scale(scale, scale),
        &mut pixmap.as_mut(),
    );
    pixmap
        .encode_png()
        .map_err(|e| candle::Error::Msg(format!("attention heatmap: encoding the PNG: {e}")))
}

/// The colour of a weight, `t` in 0..=1 of the panel's scale.
fn colour(t: f32) -> [u8; 3] {
    let t = f64::from(t).clamp(0.0, 1.0) * (SCALE.len() - 1) as f64;
    let i = (t.floor() as usize).min(SCALE.len() - 2);
    let f = t - i as f64;
    let (a, b) = (SCALE[i], SCALE[i + 1]);
    let mix = |k: usize| (f64::from(a[k]) + (f64::from(b[k]) - f64::from(a[k])) * f).round() as u8;
    [mix(0), mix(1), mix(2)]
}

fn hex([r, g, b]: [u8; 3]) -> String {
    format!("#{r:02x}{g:02x}{b:02x}")
}

/// The colour bar's label for a value: two decimals, or scientific notation for tiny values.
fn format_value(v: f32) -> String {
    if v >= 0.01 {
        format!("{v:.2}")
    } else {
        format!("{v:.1e}")
    }
}

/// A token as shown: control characters (not allowed in XML) replaced by U+FFFD, cut with an
/// ellipsis past [`MAX_LABEL_CHARS`] characters.
fn display_label(token: &str) -> String {
    let clean = token.chars().map(|c| {
        if c.is_control() || c == '\u{FFFE}' || c == '\u{FFFF}' {
            '\u{FFFD}'
        } else {
            c
        }
    });
    if token.chars().count() > MAX_LABEL_CHARS {
        clean.take(MAX_LABEL_CHARS - 1).chain(['…']).collect()
    } else {
        clean.collect()
    }
}

/// Escapes text for XML content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// Advance widths of DejaVu Sans for the printable ASCII characters `' '..='~'`, in font units
/// of 1/2048 em (read from the font's `hmtx` table).
const ASCII_ADVANCE: [u16; 95] = [
    651, 821, 942, 1716, 1303, 1946, 1597, 563, 799, 799, 1024, 1716, 651, 739, 651, 690, 1303,
    1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 690, 690, 1716, 1716, 1716, 1087, 2048,
    1401, 1405, 1430, 1577, 1294, 1178, 1587, 1540, 604, 604, 1343, 1141, 1767, 1532, 1612, 1235,
    1612, 1423, 1300, 1251, 1499, 1401, 2025, 1403, 1251, 1403, 799, 690, 799, 1716, 1024, 1024,
    1255, 1300, 1126, 1300, 1260, 721, 1300, 1298, 569, 569, 1186, 569, 1995, 1298, 1253, 1300,
    1300, 842, 1067, 803, 1298, 1212, 1675, 1212, 1212, 1075, 1303, 690, 1303, 1716,
];

/// Estimated width of `text` in px at `font_size`, from DejaVu Sans' advance widths: exact for
/// ASCII (ignoring kerning), one em for wide (CJK, emoji) characters, [`CHAR_WIDTH`] otherwise.
fn text_width(text: &str, font_size: f64) -> f64 {
    text.chars()
        .map(|c| {
            let cp = c as u32;
            let wide = matches!(cp, 0x1100..=0x115F | 0x2E80..=0xA4CF | 0xAC00..=0xD7A3
                | 0xF900..=0xFAFF | 0xFE30..=0xFE4F | 0xFF00..=0xFF60 | 0xFFE0..=0xFFE6
                | 0x1F300..=0x1FAFF | 0x20000..=0x3FFFD);
            match cp {
                0x20..=0x7E => f64::from(ASCII_ADVANCE[(cp - 0x20) as usize]) / 2048.0,
                _ if wide => 1.0,
                _ => CHAR_WIDTH,
            }
        })
        .sum::<f64>()
        * font_size
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    /// "three hundred and forty - two" → "drei hundert zwei und vierzig </s>", with the German
    /// reordering (units before tens) and four heads of different sharpness.
    fn example() -> AttentionMap {
        let source = tokens("three hundred and forty - two");
        let output = tokens("drei hundert zwei und vierzig </s>");
        // Which source token each output token mostly looks at.
        let focus = [0usize, 1, 5, 2, 3, 5];
        let mut weights = Vec::new();
        for head in 0..4 {
            let sharp = [0.92f32, 0.75, 0.55, 0.35][head];
            let mut rows = Vec::new();
            for (t, &f) in focus.iter().enumerate() {
                let mut row = vec![0f32; source.len()];
                let rest = (1.0 - sharp) / (source.len() as f32 - 1.0);
                for (s, w) in row.iter_mut().enumerate() {
                    *w = if s == f { sharp } else { rest };
                }
                // Head 3 also tracks the hyphen for "und", head 1 spreads </s> over the tail.
                if head == 3 && t == 3 {
                    row[4] += 0.2;
                    row[f] -= 0.2;
                }
                if head == 1 && t == 5 {
                    row = vec![0.02, 0.03, 0.05, 0.2, 0.3, 0.4];
                }
                rows.push(row);
            }
            weights.push(rows);
        }
        AttentionMap {
            source,
            output,
            weights,
            layer: 1,
            num_layers: 2,
        }
    }

    /// A one-hot map: output token t attends only to source token `(t + 1) % S`.
    fn one_hot(source: &[&str], output: &[&str], heads: usize) -> AttentionMap {
        let s = source.len();
        let head: Vec<Vec<f32>> = (0..output.len())
            .map(|t| {
                (0..s)
                    .map(|j| f32::from(u8::from(j == (t + 1) % s)))
                    .collect()
            })
            .collect();
        AttentionMap {
            source: source.iter().map(|x| x.to_string()).collect(),
            output: output.iter().map(|x| x.to_string()).collect(),
            weights: vec![head; heads],
            layer: 0,
            num_layers: 1,
        }
    }

    fn count(haystack: &str, needle: &str) -> usize {
        haystack.matches(needle).count()
    }

    fn err(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Ok(v) => panic!("expected an error, got {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn svg_has_every_label_escaped_each_cell_and_the_title() {
        let mut map = example();
        map.source[2] = "a&b".into();
        map.source[4] = "<->".into();
        map.output[0] = "\"drei\"".into();
        map.output[1] = "größer's".into();
        map.output[3] = "süß".into();
        let svg = render_svg(&map, Heads::Average).unwrap();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        for label in ["three", "hundred", "a&amp;b", "&lt;-&gt;", "two"] {
            assert!(svg.contains(&format!(">{label}</text>")), "{label} missing");
        }
        for label in [
            "&quot;drei&quot;",
            "größer&apos;s",
            "zwei",
            "süß",
            "vierzig",
            "&lt;/s&gt;",
        ] {
            assert!(svg.contains(&format!(">{label}</text>")), "{label} missing");
        }
        assert!(!svg.contains("<->") && !svg.contains("a&b") && !svg.contains("</s>"));
        assert_eq!(count(&svg, r#"<rect class="cell""#), 36);
        assert_eq!(count(&svg, r#"class="panel""#), 1);
        assert!(svg.contains(">cross-attention, layer 2/2, mean of 4 heads</text>"));
        // Both ends of the colour bar are labelled.
        assert!(svg.contains(r#"class="colour-bar""#));
        assert!(svg.contains(">0</text>"));
        // The SVG is well-formed enough for usvg.
        usvg::Tree::from_str(&svg, &usvg::Options::default()).unwrap();
    }

    #[test]
    fn all_draws_one_titled_panel_per_head_four_per_row() {
        let map = one_hot(&["a", "b", "c"], &["x", "y"], 6);
        let svg = render_svg(&map, Heads::All).unwrap();
        assert_eq!(count(&svg, r#"class="panel""#), 6);
        assert_eq!(count(&svg, r#"<rect class="cell""#), 6 * 2 * 3);
        for h in 0..6 {
            assert!(svg.contains(&format!(">head {h}</text>")));
        }
        assert!(svg.contains(">cross-attention, layer 1/1, all 6 heads</text>"));
        let fig = Figure::plan(&map, Heads::All).unwrap();
        // Row 0 holds heads 0..4, row 1 heads 4 and 5.
        assert_eq!(fig.origins[0].1, fig.origins[3].1);
        assert!(fig.origins[4].1 > fig.origins[3].1);
        assert_eq!(fig.origins[4].0, fig.origins[0].0);
        assert!(fig.origins[3].0 > fig.origins[2].0);
    }

    #[test]
    fn average_is_the_mean_over_heads_and_one_selects_a_head() {
        let mut map = one_hot(&["a", "b"], &["x"], 2);
        map.weights[0] = vec![vec![1.0, 0.0]];
        map.weights[1] = vec![vec![0.0, 1.0]];
        let avg = Figure::plan(&map, Heads::Average).unwrap();
        assert_eq!(avg.panels.len(), 1);
        assert_eq!(avg.panels[0].values, vec![vec![0.5, 0.5]]);
        // Both cells are at the panel maximum, so both get the darkest colour.
        let svg = render_svg(&map, Heads::Average).unwrap();
        assert_eq!(count(&svg, "fill=\"#08306b\""), 2);
        assert!(svg.contains(">0.50</text>"));

        let one = Figure::plan(&map, Heads::One(1)).unwrap();
        assert_eq!(one.panels[0].values, vec![vec![0.0, 1.0]]);
        assert_eq!(
            one.title,
            "cross-attention, layer 1/1, head 1 of 2 (0-based)"
        );
        let e = err(render_svg(&map, Heads::One(2)));
        assert!(e.contains("head 2") && e.contains("2 heads"), "{e}");
    }

    #[test]
    fn all_zero_weights_draw_white_cells() {
        let mut map = one_hot(&["a", "b"], &["x", "y"], 1);
        map.weights[0] = vec![vec![0.0, 0.0]; 2];
        let svg = render_svg(&map, Heads::Average).unwrap();
        assert_eq!(count(&svg, "fill=\"#f7fbff\""), 4);
        assert!(svg.contains(">1.00</text>"));
    }

    #[test]
    fn malformed_maps_are_errors_that_name_the_sizes() {
        let good = one_hot(&["a", "b", "c"], &["x", "y"], 2);
        assert!(render_svg(&good, Heads::Average).is_ok());

        let mut m = good.clone();
        m.weights[1].pop();
        let e = err(render_svg(&m, Heads::Average));
        assert!(
            e.contains("head 1 has 1 rows") && e.contains("expected 2"),
            "{e}"
        );

        let mut m = good.clone();
        m.weights[0][1].push(0.0);
        let e = err(render_svg(&m, Heads::All));
        assert!(
            e.contains("head 0, row 1") && e.contains("4 weights"),
            "{e}"
        );
        assert!(e.contains("expected 3") && e.contains("2 × 3"), "{e}");

        let mut m = good.clone();
        m.weights.clear();
        assert!(err(render_svg(&m, Heads::Average)).contains("no heads"));

        let mut m = good.clone();
        m.source.clear();
        assert!(err(render_svg(&m, Heads::Average)).contains("no source tokens"));

        let mut m = good.clone();
        m.output.clear();
        assert!(err(render_svg(&m, Heads::Average)).contains("no output tokens"));

        let mut m = good.clone();
        m.weights[1][0][2] = f32::NAN;
        let e = err(render_png(&m, Heads::One(0)));
        assert!(e.contains("NaN") && e.contains("head 1, row 0"), "{e}");

        let mut m = good.clone();
        m.weights[0][0][0] = -0.5;
        assert!(err(render_svg(&m, Heads::Average)).contains("non-negative"));

        let mut m = good.clone();
        m.layer = 1;
        let e = err(render_svg(&m, Heads::Average));
        assert!(e.contains("layer 1") && e.contains("1 layers"), "{e}");
    }

    #[test]
    fn save_picks_the_format_by_extension_and_rejects_others() {
        let map = one_hot(&["a", "b"], &["x"], 1);
        let dir = std::env::temp_dir();
        let stem = format!("heatmap-test-{}", std::process::id());

        let e = err(save(&map, Heads::Average, &dir.join(format!("{stem}.jpg"))));
        assert!(
            e.contains(".jpg") && e.contains(".svg") && e.contains(".png"),
            "{e}"
        );
        let e = err(save(&map, Heads::Average, &dir.join(&stem)));
        assert!(e.contains("no extension") && e.contains(".svg"), "{e}");

        let svg_path = dir.join(format!("{stem}.SVG"));
        save(&map, Heads::Average, &svg_path).unwrap();
        let text = std::fs::read_to_string(&svg_path).unwrap();
        assert_eq!(text, render_svg(&map, Heads::Average).unwrap());
        std::fs::remove_file(&svg_path).unwrap();

        let png_path = dir.join(format!("{stem}.Png"));
        save(&map, Heads::Average, &png_path).unwrap();
        let bytes = std::fs::read(&png_path).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
        std::fs::remove_file(&png_path).unwrap();

        let e = err(save(
            &map,
            Heads::Average,
            Path::new("/nonexistent-dir/x.svg"),
        ));
        assert!(e.contains("/nonexistent-dir/x.svg"), "{e}");
    }

    #[test]
    fn png_has_the_signature_the_size_and_dark_cells_where_weights_are_high() {
        let map = one_hot(
            &["eins", "zwei", "drei"],
            &["one", "two", "three", "</s>"],
            2,
        );
        let png = render_png(&map, Heads::Average).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
        let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
        let fig = Figure::plan(&map, Heads::Average).unwrap();
        assert_eq!(width, (fig.width * f64::from(PNG_SCALE)).ceil() as u32);
        assert_eq!(height, (fig.height * f64::from(PNG_SCALE)).ceil() as u32);
        assert!((100..2000).contains(&width) && (100..2000).contains(&height));

        let pixmap = tiny_skia::Pixmap::decode_png(&png).unwrap();
        let brightness = |t: usize, s: usize| {
            let (x, y) = fig.cell_centre(0, t, s);
            let scale = f64::from(PNG_SCALE);
            let p = pixmap
                .pixel((x * scale) as u32, (y * scale) as u32)
                .unwrap();
            u32::from(p.red()) + u32::from(p.green()) + u32::from(p.blue())
        };
        for t in 0..4 {
            for s in 0..3 {
                let b = brightness(t, s);
                if s == (t + 1) % 3 {
                    assert!(b < 250, "cell ({t}, {s}) with weight 1 has brightness {b}");
                } else {
                    assert!(b > 700, "cell ({t}, {s}) with weight 0 has brightness {b}");
                }
            }
        }
    }

    #[test]
    fn png_text_is_drawn_with_the_embedded_font() {
        let map = one_hot(&["größer", "süß"], &["Äpfel", "öl"], 1);
        let png = render_png(&map, Heads::Average).unwrap();
        let pixmap = tiny_skia::Pixmap::decode_png(&png).unwrap();
        let fig = Figure::plan(&map, Heads::Average).unwrap();
        let scale = f64::from(PNG_SCALE);
        let dark_in = |x0: f64, y0: f64, x1: f64, y1: f64| {
            let mut n = 0;
            for y in (y0 * scale) as u32..(y1 * scale) as u32 {
                for x in (x0 * scale) as u32..(x1 * scale) as u32 {
                    let p = pixmap.pixel(x, y).unwrap();
                    n += usize::from(u32::from(p.red()) + u32::from(p.green()) < 200);
                }
            }
            n
        };
        // The title, and the row labels left of the grid.
        assert!(
            dark_in(
                MARGIN,
                MARGIN,
                fig.width - MARGIN,
                MARGIN + TITLE_FONT + 4.0
            ) > 100
        );
        let (ox, oy) = fig.origins[0];
        let rows = dark_in(
            ox,
            oy + fig.grid_y,
            ox + fig.grid_x,
            oy + fig.grid_y + 2.0 * CELL,
        );
        assert!(rows > 50, "row labels: {rows} dark pixels");
        // The column labels above the grid.
        let cols = dark_in(ox + fig.grid_x, oy, fig.width, oy + fig.grid_y);
        assert!(cols > 50, "column labels: {cols} dark pixels");
    }

    #[test]
    fn long_source_labels_are_rotated_and_short_ones_are_not() {
        let short = one_hot(&["a", "bc", "-"], &["x"], 1);
        assert!(!Figure::plan(&short, Heads::Average).unwrap().rotate_columns);
        let long = one_hot(&["three", "hundred"], &["x"], 1);
        let fig = Figure::plan(&long, Heads::Average).unwrap();
        assert!(fig.rotate_columns);
        assert!(render_svg(&long, Heads::Average)
            .unwrap()
            .contains("rotate(-45"));
        // The rotated labels fit inside the picture.
        assert!(fig.grid_y >= text_width("hundred", FONT) * DIAG);
    }

    #[test]
    fn estimated_label_widths_match_the_embedded_font() {
        let options = usvg::Options {
            fontdb: font_database(),
            ..usvg::Options::default()
        };
        for label in [
            "hundred",
            "vierzig",
            "</s>",
            "WWWW",
            "größer",
            "Äpfel süß",
            "a&b",
        ] {
            let svg = format!(
                r#"<svg xmlns="http://www.w3.org/2000/svg" width="400" height="40" font-family="{FONT_FAMILY}" font-size="{FONT}"><text x="10" y="20">{}</text></svg>"#,
                escape(label)
            );
            let tree = usvg::Tree::from_str(&svg, &options).unwrap();
            // The ink is a little narrower than the advances (side bearings).
            let ink = f64::from(tree.root().abs_bounding_box().width());
            let estimate = text_width(label, FONT);
            assert!(
                ink > 0.8 * estimate && ink <= estimate + 1.0,
                "{label}: estimated {estimate:.1} px, drawn {ink:.1} px"
            );
        }
    }

    #[test]
    fn labels_are_cleaned_escaped_and_cut() {
        assert_eq!(
            escape(r#"<a href="x">&'"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&apos;"
        );
        assert_eq!(display_label("a\u{0}b\nc"), "a\u{FFFD}b\u{FFFD}c");
        let long = "x".repeat(100);
        let cut = display_label(&long);
        assert_eq!(cut.chars().count(), MAX_LABEL_CHARS);
        assert!(cut.ends_with('…'));
        assert_eq!(colour(0.0), SCALE[0]);
        assert_eq!(colour(1.0), SCALE[8]);
        assert_eq!(format_value(0.5), "0.50");
        assert_eq!(format_value(0.004), "4.0e-3");
    }

    /// Writes `heatmap_example.{svg,png}` (mean of heads) and `heatmap_example_all.png` (every
    /// head) to the temporary directory, to look at: `cargo test -- --ignored write_example`.
    #[test]
    #[ignore]
    fn write_example_images() {
        let map = example();
        let dir = std::env::temp_dir();
        save(&map, Heads::Average, &dir.join("heatmap_example.svg")).unwrap();
        save(&map, Heads::Average, &dir.join("heatmap_example.png")).unwrap();
        save(&map, Heads::All, &dir.join("heatmap_example_all.png")).unwrap();
        save(&map, Heads::One(3), &dir.join("heatmap_example_head3.png")).unwrap();
    }
}
