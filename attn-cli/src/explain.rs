//! `attn explain`: one attention block of a real model on a real sentence, step by step (the
//! numbers come from `candle_attention::explain`; this module parses, prints and draws).

use anyhow::Context;
use attn_cli::heatmap::steps::{save_steps, ColourScale, MatrixPanel};
use attn_cli::number_translator::translator::Translator;
use attn_cli::shipped;
use candle_attention::explain::{AttentionUse, Explanation, RowStats};
use candle_attention::marian::MarianTranslator;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// The model to explain: a Hugging Face MarianMT directory (config.json, weights,
    /// source.spm, target.spm, vocab.json) or a directory written by `attn train`. Default: the
    /// number translator built into attn.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Layer, 0-based, within its stack: the encoder's for encoder-self, the decoder's
    /// otherwise.
    #[arg(long, default_value_t = 0, value_name = "N")]
    layer: usize,
    /// Head, 0-based, shown step by step (the others are summarised).
    #[arg(long, default_value_t = 0, value_name = "N")]
    head: usize,
    /// Which attention of the layer: encoder-self, decoder-self (causal) or cross
    /// (encoder-decoder). The decoder's input is the model's own greedy translation of TEXT,
    /// teacher-forced.
    #[arg(long = "use", value_name = "USE", default_value = "encoder-self")]
    attention: String,
    /// The query (row, 0-based) whose blend of values is written out term by term. Default:
    /// the last.
    #[arg(long, value_name = "N")]
    query: Option<usize>,
    /// Width of the text output, in columns; wider matrices are cut with a note. Default:
    /// $COLUMNS, else the terminal's width, else 100.
    #[arg(long, value_name = "COLUMNS")]
    width: Option<usize>,
    /// Print every matrix of every head as one JSON object instead of the text (masked
    /// entries of `masked` are null: JSON has no -inf).
    #[arg(long)]
    json: bool,
    /// Also draw the four steps of the head (scores, scaled and masked scores, weights,
    /// output) as an SVG picture into FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Also draw the same figure as a PNG picture into FILE.
    #[arg(long, value_name = "FILE")]
    png: Option<PathBuf>,
    /// The text to run the model on (English number words for the built-in model, e.g.
    /// "forty-two").
    text: String,
}

/// The default width when neither `--width`, `$COLUMNS` nor a terminal says.
const DEFAULT_WIDTH: usize = 100;
/// Narrower than this, nothing fits: the text is laid out for this width.
const MIN_WIDTH: usize = 40;
/// Row and column labels are cut (with `…`) past this many characters.
const MAX_LABEL: usize = 10;
/// Terms of a written-out blend with a smaller weight are summed up, not listed.
const BLEND_MIN_WEIGHT: f32 = 0.01;

pub fn run(args: &ExplainArgs) -> anyhow::Result<()> {
    let attention: AttentionUse = args.attention.parse()?;
    let device = candle::Device::Cpu;
    let model = args
        .model
        .as_deref()
        .map(crate::model_source::resolve_model)
        .transpose()?;
    let (explanation, model_name) = match &model {
        None => {
            let translator =
                shipped::translator(&device).context("loading the built-in translation model")?;
            (
                explain_number_translator(&translator, &args.text, attention, args.layer)?,
                "the shipped number translator".to_string(),
            )
        }
        Some(dir) if dir.join("vocab.en.json").is_file() => {
            let translator = Translator::load(dir, &device)
                .with_context(|| format!("loading the translation model in {}", dir.display()))?;
            (
                explain_number_translator(&translator, &args.text, attention, args.layer)?,
                format!("the number translator in {}", dir.display()),
            )
        }
        Some(dir) => {
            let translator = MarianTranslator::from_dir(dir, &device)
                .with_context(|| format!("loading the MarianMT model in {}", dir.display()))?;
            (
                Explanation::of_model(
                    translator.model(),
                    translator.teacher_forcing(&args.text)?,
                    attention,
                    args.layer,
                )?,
                format!("MarianMT {}", dir.display()),
            )
        }
    };
    let steps = &explanation.steps;
    steps.check_head(args.head).map_err(|e| {
        anyhow::anyhow!(
            "{e}; layer {}'s {} has {} heads",
            args.layer,
            attention.describe(),
            steps.num_heads
        )
    })?;
    let queries = steps.num_queries();
    let query = args.query.unwrap_or(queries.saturating_sub(1));
    if query >= queries {
        anyhow::bail!(
            "query {query} does not exist: there are {queries} queries (valid: 0..={})",
            queries.saturating_sub(1)
        )
    }
    for (path, ext) in [(&args.svg, "svg"), (&args.png, "png")] {
        if let Some(path) = path {
            draw(&explanation, args.head, path, ext)?;
            eprintln!(
                "the four steps of head {} drawn to {}",
                args.head,
                path.display()
            );
        }
    }
    if args.json {
        let value = to_json(&explanation, &model_name, &args.text, args.head)?;
        println!("{}", serde_json::to_string(&value)?);
        return Ok(());
    }
    let width = args.width.unwrap_or_else(terminal_width).max(MIN_WIDTH);
    print!(
        "{}",
        render_text(
            &explanation,
            &model_name,
            &args.text,
            args.head,
            query,
            width
        )?
    );
    Ok(())
}

/// `$COLUMNS`, else the width of the terminal on stdout, else [`DEFAULT_WIDTH`].
fn terminal_width() -> usize {
    if let Some(n) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n;
    }
    #[cfg(unix)]
    {
        let mut size = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` into the struct we pass, which lives for the
        // whole call; on a descriptor that is no terminal it fails and writes nothing.
        let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
        if ok && size.ws_col > 0 {
            return size.ws_col as usize;
        }
    }
    DEFAULT_WIDTH
}

/// A label cut to `max` characters with `…`, control characters shown as `?`.
fn label(s: &str, max: usize) -> String {
    let clean: String = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if clean.chars().count() > max {
        clean
            .chars()
            .take(max.saturating_sub(1))
            .chain(['…'])
            .collect()
    } else {
        clean
    }
}

fn pad_left(s: &str, width: usize) -> String {
    let n = s.chars().count();
    format!("{}{s}", " ".repeat(width.saturating_sub(n)))
}

fn pad_right(s: &str, width: usize) -> String {
    let n = s.chars().count();
    format!("{s}{}", " ".repeat(width.saturating_sub(n)))
}

/// A number with `decimals` places; `-inf` as such, and no `-0.00`.
fn number(v: f32, decimals: usize) -> String {
    if v == f32::NEG_INFINITY {
        return "-inf".to_string();
    }
    let s = format!("{v:.decimals$}");
    if s.starts_with('-') && s[1..].chars().all(|c| c == '0' || c == '.') {
        s[1..].to_string()
    } else {
        s
    }
}

/// A matrix with row labels on the left and column labels on top, indented by `indent`,
/// every line at most `width` characters: columns that do not fit are left out and a note
/// says which (never wrapped).
pub fn format_matrix(
    rows: &[String],
    columns: &[String],
    cells: &[Vec<String>],
    indent: usize,
    width: usize,
) -> String {
    let row_w = rows
        .iter()
        .map(|r| label(r, MAX_LABEL).chars().count())
        .max()
        .unwrap_or(0);
    let col_labels: Vec<String> = columns.iter().map(|c| label(c, MAX_LABEL)).collect();
    let cell_w = cells
        .iter()
        .flatten()
        .map(|c| c.chars().count())
        .chain(col_labels.iter().map(|c| c.chars().count()))
        .max()
        .unwrap_or(1);
    let col_labels: Vec<String> = col_labels.iter().map(|c| label(c, cell_w)).collect();
    let used = indent + row_w;
    let fit = (width.saturating_sub(used) / (cell_w + 1)).max(1);
    let shown = columns.len().min(fit);
    let mut out = String::new();
    let pad = " ".repeat(indent);
    let mut header = format!("{pad}{}", " ".repeat(row_w));
    for c in &col_labels[..shown] {
        header.push(' ');
        header.push_str(&pad_left(c, cell_w));
    }
    out.push_str(header.trim_end());
    out.push('\n');
    for (r, row) in rows.iter().zip(cells) {
        let mut line = format!("{pad}{}", pad_right(&label(r, MAX_LABEL), row_w));
        for c in &row[..shown] {
            line.push(' ');
            line.push_str(&pad_left(c, cell_w));
        }
        out.push_str(&line);
        out.push('\n');
    }
    if shown < columns.len() {
        let hidden = columns.len() - shown;
        let note = format!(
            "{pad}({hidden} more column{} not shown ({}..={}): widen with --width, or see --json)",
            if hidden == 1 { "" } else { "s" },
            shown,
            columns.len() - 1
        );
        out.push_str(&wrap(&note, width, indent + 1));
        out.push('\n');
    }
    out
}

/// Numbers with `decimals` places, as cells.
fn cells(values: &[Vec<f32>], decimals: usize) -> Vec<Vec<String>> {
    values
        .iter()
        .map(|row| row.iter().map(|&v| number(v, decimals)).collect())
        .collect()
}

/// Prose wrapped at word boundaries to `width`; the first line keeps its leading spaces and
/// continuation lines are indented by `indent` (at least as much as the first line).
fn wrap(text: &str, width: usize, indent: usize) -> String {
    let lead = text.chars().take_while(|&c| c == ' ').count();
    let indent = indent.max(lead);
    let mut out = String::new();
    let mut line = " ".repeat(lead);
    let mut empty = true;
    for word in text[lead..].split(' ').filter(|w| !w.is_empty()) {
        let len = line.chars().count();
        if !empty && len + 1 + word.chars().count() > width {
            out.push_str(line.trim_end());
            out.push('\n');
            line = " ".repeat(indent);
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(line.trim_end());
    out
}

/// `prefix` then as many of `values` as fit in `width` (`[a, b, … n more]`).
fn fit_vector(prefix: &str, values: &[f32], suffix: &str, width: usize) -> String {
    let all: Vec<String> = values.iter().map(|&v| number(v, 3)).collect();
    let mut shown = all.len();
    loop {
        let mut parts: Vec<String> = all[..shown].to_vec();
        if shown < all.len() {
            parts.push(format!("… {} more", all.len() - shown));
        }
        let line = format!("{prefix}[{}]{suffix}", parts.join(", "));
        if line.chars().count() <= width {
            return line;
        }
        if shown == 0 {
            return format!("{prefix}[{}]", parts.join(", "));
        }
        shown -= 1;
    }
}

/// The text output: every step for `head`, the blend of `query`, the √d_k comparison and the
/// per-head summary, each line at most `width` characters (prose wrapped, matrices cut).
pub fn render_text(
    e: &Explanation,
    model: &str,
    text: &str,
    head: usize,
    query: usize,
    width: usize,
) -> anyhow::Result<String> {
    let s = &e.steps;
    let (l, n_keys, h, d, dv) = (
        s.num_queries(),
        s.num_keys(),
        s.num_heads,
        s.head_dim,
        s.value_dim,
    );
    let e_dim = s.query_input.dim(1)?;
    let rows = &e.query_tokens;
    let cols = &e.key_tokens;
    let mut out = String::new();
    let para = |out: &mut String, t: &str| {
        out.push_str(&wrap(t, width, 3));
        out.push('\n');
    };
    para(
        &mut out,
        &format!(
            "Attention, step by step: {}, layer {} of {} (0-based), head {head} of {h}",
            e.attention.describe(),
            e.layer,
            e.num_layers
        ),
    );
    para(
        &mut out,
        &format!("model: {model}: d_model = {e_dim}, {h} heads, d_k = d_v = {e_dim} / {h} = {d}"),
    );
    para(&mut out, &format!("text: {text:?}"));
    para(
        &mut out,
        &format!(
            "source tokens ({}): {}",
            e.example.source_tokens.len(),
            e.example.source_tokens.join(" ")
        ),
    );
    if e.attention != AttentionUse::EncoderSelf {
        para(
            &mut out,
            &format!(
                "decoder input ({}): {} (the model's greedy translation {:?}, teacher-forced: \
                 position t reads token t and predicts token t + 1)",
                e.example.decoder_tokens.len(),
                e.example.decoder_tokens.join(" "),
                e.example.translation
            ),
        );
    }
    let (row_what, col_what) = match e.attention {
        AttentionUse::EncoderSelf => ("source tokens", "source tokens"),
        AttentionUse::DecoderSelf => ("decoder positions", "decoder positions"),
        AttentionUse::Cross => ("decoder positions", "source tokens"),
    };
    para(
        &mut out,
        &format!("rows = queries (L = {l}, {row_what}); columns = keys (S = {n_keys}, {col_what})"),
    );

    out.push('\n');
    para(
        &mut out,
        &format!(
            "1. Project. Each token's {e_dim} features become a query, a key and a value for \
             head {head}: Q = X·W^Q ({l}×{d}), K = X·W^K ({n_keys}×{d}), V = X·W^V ({n_keys}×{dv})"
        ),
    );
    out.push('\n');
    para(
        &mut out,
        &format!(
            "2. Compare every query with every key: Q ({l}×{d}) · Kᵀ ({d}×{n_keys}) = scores \
             ({l}×{n_keys})"
        ),
    );
    let scores = s.head_rows(&s.scores, head)?;
    out.push_str(&format_matrix(rows, cols, &cells(&scores, 2), 3, width));
    out.push('\n');
    let sqrt_d = (d as f64).sqrt();
    para(
        &mut out,
        &format!(
            "3. Scale: divide by √d_k = √{d} = {} so that the softmax does not saturate: scaled \
             ({l}×{n_keys})",
            number(sqrt_d as f32, 2)
        ),
    );
    let scaled = s.head_rows(&s.scaled, head)?;
    out.push_str(&format_matrix(rows, cols, &cells(&scaled, 2), 3, width));
    out.push('\n');
    let blocked = s.blocked(head)?;
    // The additive mask as printed: -inf where a key is blocked, 0 where it is visible.
    let mask_cells = |blocked: &[Vec<bool>]| -> Vec<Vec<String>> {
        blocked
            .iter()
            .map(|r| {
                r.iter()
                    .map(|&b| if b { "-inf" } else { "0" }.to_string())
                    .collect()
            })
            .collect()
    };
    let any_blocked = blocked.iter().flatten().any(|&b| b);
    match (e.attention, any_blocked) {
        (AttentionUse::DecoderSelf, _) => {
            para(
                &mut out,
                "4. Mask: causal. Position t may look at positions 0..=t only, never ahead: -inf \
                 above the diagonal is added to the scaled scores, so those keys get weight \
                 exp(-inf) = 0.",
            );
            out.push_str(&format_matrix(rows, cols, &mask_cells(&blocked), 3, width));
        }
        (_, true) => {
            para(
                &mut out,
                "4. Mask: padding keys get -inf (no query looks at them):",
            );
            out.push_str(&format_matrix(rows, cols, &mask_cells(&blocked), 3, width));
        }
        (_, false) => para(
            &mut out,
            "4. Mask: none. Every query may look at every key (no padding in one sentence; only \
             decoder self-attention is causal).",
        ),
    }
    out.push('\n');
    let weights = s.head_rows(&s.weights, head)?;
    let worst_sum = weights
        .iter()
        .filter(|r| r.iter().any(|&w| w > 0.0))
        .map(|r| (r.iter().map(|&w| w as f64).sum::<f64>() - 1.0).abs())
        .fold(0.0, f64::max);
    para(
        &mut out,
        &format!(
            "5. Softmax, row by row: weights ({l}×{n_keys}); each row sums to 1 (largest |sum − \
             1| = {worst_sum:.1e})"
        ),
    );
    out.push_str(&format_matrix(rows, cols, &cells(&weights, 3), 3, width));
    para(&mut out, "   Each query attends most to:");
    let stats: Vec<RowStats> = weights.iter().map(|p| RowStats::of(p)).collect();
    let row_w = rows
        .iter()
        .map(|r| label(r, MAX_LABEL).chars().count())
        .max()
        .unwrap_or(0);
    for (r, st) in rows.iter().zip(&stats) {
        // Short lines (labels are cut), aligned: not wrapped.
        let _ = writeln!(
            out,
            "     {} → {} ({})",
            pad_right(&label(r, MAX_LABEL), row_w),
            label(&cols[st.argmax], MAX_LABEL),
            number(st.max_weight, 3)
        );
    }
    out.push('\n');
    para(
        &mut out,
        &format!(
            "6. Blend the values with the weights: weights ({l}×{n_keys}) · V ({n_keys}×{dv}) = \
             head output ({l}×{dv}). For query {query} ({:?}):",
            rows[query]
        ),
    );
    let w = &weights[query];
    let v = s.head_rows(&s.v, head)?;
    let blended = s.head_rows(&s.blended, head)?;
    let mut order: Vec<usize> = (0..n_keys).collect();
    order.sort_by(|&a, &b| w[b].total_cmp(&w[a]));
    let listed: Vec<usize> = order
        .iter()
        .copied()
        .filter(|&j| w[j] >= BLEND_MIN_WEIGHT)
        .collect();
    let rest: f32 = order
        .iter()
        .filter(|&&j| w[j] < BLEND_MIN_WEIGHT)
        .map(|&j| w[j])
        .sum();
    let rest_n = n_keys - listed.len();
    let mut sum = format!("   out[{}] = ", label(&rows[query], MAX_LABEL));
    let terms: Vec<String> = listed
        .iter()
        .map(|&j| format!("{}·v[{}]", number(w[j], 3), label(&cols[j], MAX_LABEL)))
        .collect();
    sum.push_str(&terms.join(" + "));
    match rest_n {
        0 => {}
        1 => {
            let _ = write!(sum, " + (the other key, weight {})", number(rest, 3));
        }
        n => {
            let _ = write!(
                sum,
                " + (the other {n} keys, weight {} together)",
                number(rest, 3)
            );
        }
    }
    out.push_str(&wrap(&sum, width, 6));
    out.push('\n');
    for &j in listed.iter().take(3) {
        let prefix = format!("     v[{}] = ", label(&cols[j], MAX_LABEL));
        out.push_str(&fit_vector(&prefix, &v[j], "", width));
        out.push('\n');
    }
    out.push_str(&fit_vector(
        &format!("   out[{}] = ", label(&rows[query], MAX_LABEL)),
        &blended[query],
        &format!(" ({dv} numbers)"),
        width,
    ));
    out.push('\n');
    out.push('\n');
    para(
        &mut out,
        &format!(
            "7. {h} heads side by side: concat ({l}×{h}·{dv} = {l}×{}), then W^O: ({l}×{}) · \
             W^Oᵀ ({}×{e_dim}) + b = output ({l}×{e_dim}). The model's own forward pass \
             (MultiHeadAttention::attend) gave this block the same output: max |difference| = \
             {:.1e}.",
            h * dv,
            h * dv,
            h * dv,
            e.max_forward_difference()?
        ),
    );
    out.push('\n');
    let cmp = s.scaling_comparison(head)?;
    para(
        &mut out,
        &format!(
            "8. Why divide by √d_k? The dot product of two {d}-dimensional vectors grows with \
             d_k: here the raw scores spread with standard deviation {}, the scaled ones {}. The \
             same scores through the softmax with and without the division (head {head}): per \
             query the largest weight (w), the entropy in bits (H) and the largest entry of the \
             softmax gradient (grad), with the division (÷√dk, what the model does) and without \
             (raw):",
            number(cmp.raw_std, 2),
            number(cmp.scaled_std, 2)
        ),
    );
    let cmp_rows: Vec<Vec<String>> = cmp
        .scaled
        .iter()
        .zip(&cmp.unscaled)
        .map(|(a, b)| {
            vec![
                number(a.max_weight, 3),
                number(b.max_weight, 3),
                number(a.entropy_bits, 2),
                number(b.entropy_bits, 2),
                number(a.max_gradient, 3),
                number(b.max_gradient, 3),
            ]
        })
        .collect();
    let cmp_cols: Vec<String> = [
        "w ÷√dk",
        "w raw",
        "H ÷√dk",
        "H raw",
        "grad ÷√dk",
        "grad raw",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    out.push_str(&format_matrix_wide_labels(
        rows, &cmp_cols, &cmp_rows, 3, width,
    ));
    let mean = |f: &dyn Fn(&RowStats) -> f32, v: &[RowStats]| -> f32 {
        v.iter().map(f).sum::<f32>() / v.len().max(1) as f32
    };
    para(
        &mut out,
        &format!(
            "   On average: largest weight {} with the scaling, {} without; entropy {} vs {} \
             bits; largest softmax gradient {} vs {} (at most 0.25). Without the division the \
             softmax is closer to one-hot and passes less gradient back: the paper's reason, on \
             this model's numbers.",
            number(mean(&|r| r.max_weight, &cmp.scaled), 3),
            number(mean(&|r| r.max_weight, &cmp.unscaled), 3),
            number(mean(&|r| r.entropy_bits, &cmp.scaled), 2),
            number(mean(&|r| r.entropy_bits, &cmp.unscaled), 2),
            number(mean(&|r| r.max_gradient, &cmp.scaled), 3),
            number(mean(&|r| r.max_gradient, &cmp.unscaled), 3),
        ),
    );
    out.push('\n');
    para(
        &mut out,
        &format!(
            "9. {h} perspectives: for each head, the key each query attends to most (columns are \
             the queries) and the mean entropy of its rows in bits (low = focused):"
        ),
    );
    let summaries = s.head_summaries()?;
    let head_rows: Vec<String> = summaries
        .iter()
        .map(|hs| format!("head {} H={}", hs.head, number(hs.mean_entropy_bits, 2)))
        .collect();
    let head_cells: Vec<Vec<String>> = summaries
        .iter()
        .map(|hs| hs.rows.iter().map(|r| label(&cols[r.argmax], 7)).collect())
        .collect();
    out.push_str(&format_matrix_wide_labels(
        &head_rows,
        rows,
        &head_cells,
        3,
        width,
    ));
    Ok(out)
}

/// [`format_matrix`] for row labels that must not be cut (they carry numbers).
fn format_matrix_wide_labels(
    rows: &[String],
    columns: &[String],
    cells: &[Vec<String>],
    indent: usize,
    width: usize,
) -> String {
    let longest = rows.iter().map(|r| r.chars().count()).max().unwrap_or(0);
    if longest <= MAX_LABEL {
        return format_matrix(rows, columns, cells, indent, width);
    }
    // Move the labels into the indent: print them padded, then the matrix without them.
    let body = format_matrix(
        &vec![String::new(); rows.len()],
        columns,
        cells,
        indent + longest,
        width,
    );
    let mut out = String::new();
    for (i, line) in body.lines().enumerate() {
        if i >= 1 && i <= rows.len() {
            let lab = pad_right(&rows[i - 1], longest);
            let rest: String = line.chars().skip(indent + longest).collect();
            let _ = writeln!(out, "{}{lab}{rest}", " ".repeat(indent));
        } else {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

fn matrix_json(rows: &[Vec<f32>]) -> Value {
    json!(rows)
}

/// Every matrix of every head, with the tokens and the comparisons, as one JSON object.
pub fn to_json(e: &Explanation, model: &str, text: &str, head: usize) -> anyhow::Result<Value> {
    let s = &e.steps;
    let two =
        |t: &candle::Tensor| -> anyhow::Result<Value> { Ok(matrix_json(&t.to_vec2::<f32>()?)) };
    let mut heads = Vec::with_capacity(s.num_heads);
    for h in 0..s.num_heads {
        let blocked = s.blocked(h)?;
        heads.push(json!({
            "head": h,
            "q": matrix_json(&s.head_rows(&s.q, h)?),
            "k": matrix_json(&s.head_rows(&s.k, h)?),
            "v": matrix_json(&s.head_rows(&s.v, h)?),
            "scores": matrix_json(&s.head_rows(&s.scores, h)?),
            "scaled": matrix_json(&s.head_rows(&s.scaled, h)?),
            "mask": blocked,
            "masked": matrix_json(&s.head_rows(&s.masked, h)?),
            "weights": matrix_json(&s.head_rows(&s.weights, h)?),
            "output": matrix_json(&s.head_rows(&s.blended, h)?),
        }));
    }
    let stats = |r: &RowStats| {
        json!({
            "argmax": r.argmax,
            "max_weight": r.max_weight,
            "entropy_bits": r.entropy_bits,
            "max_gradient": r.max_gradient,
        })
    };
    let cmp = s.scaling_comparison(head)?;
    let summaries: Vec<Value> = s
        .head_summaries()?
        .iter()
        .map(|hs| {
            json!({
                "head": hs.head,
                "mean_entropy_bits": hs.mean_entropy_bits,
                "rows": hs.rows.iter().map(stats).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(json!({
        "model": model,
        "text": text,
        "use": e.attention.name(),
        "layer": e.layer,
        "num_layers": e.num_layers,
        "head": head,
        "num_heads": s.num_heads,
        "d_model": s.query_input.dim(1)?,
        "d_k": s.head_dim,
        "d_v": s.value_dim,
        "scale": s.scale,
        "source_tokens": e.example.source_tokens,
        "decoder_tokens": e.example.decoder_tokens,
        "translation": e.example.translation,
        "query_tokens": e.query_tokens,
        "key_tokens": e.key_tokens,
        "query_input": two(&s.query_input)?,
        "key_input": two(&s.key_input)?,
        "heads": heads,
        "concat": two(&s.concat)?,
        "output": two(&s.output)?,
        "forward_output": two(&e.forward_output)?,
        "max_forward_difference": e.max_forward_difference()?,
        "scaling": {
            "head": cmp.head,
            "sqrt_d_k": cmp.sqrt_d_k,
            "raw_std": cmp.raw_std,
            "scaled_std": cmp.scaled_std,
            "scaled": cmp.scaled.iter().map(stats).collect::<Vec<_>>(),
            "unscaled": cmp.unscaled.iter().map(stats).collect::<Vec<_>>(),
        },
        "head_summaries": summaries,
    }))
}

/// The four steps of `head` (scores, scaled scores with the mask, weights, the head's output)
/// as one figure.
fn draw(e: &Explanation, head: usize, path: &Path, ext: &str) -> anyhow::Result<()> {
    let has_ext = path
        .extension()
        .is_some_and(|x| x.to_string_lossy().eq_ignore_ascii_case(ext));
    if !has_ext {
        anyhow::bail!(
            "--{ext} needs a file name ending in .{ext}, got {}",
            path.display()
        )
    }
    let s = &e.steps;
    let rows = e.query_tokens.clone();
    let cols = e.key_tokens.clone();
    let features: Vec<String> = (0..s.value_dim).map(|i| i.to_string()).collect();
    let (l, n, d, dv) = (s.num_queries(), s.num_keys(), s.head_dim, s.value_dim);
    let panels = vec![
        MatrixPanel {
            title: format!("1. scores Q·Kᵀ ({l}×{n})"),
            rows: rows.clone(),
            columns: cols.clone(),
            values: s.head_rows(&s.scores, head)?,
            scale: ColourScale::Diverging,
        },
        MatrixPanel {
            title: format!("2. scaled ÷√{d}, masked"),
            rows: rows.clone(),
            columns: cols.clone(),
            values: s.head_rows(&s.masked, head)?,
            scale: ColourScale::Diverging,
        },
        MatrixPanel {
            title: "3. softmax weights".to_string(),
            rows: rows.clone(),
            columns: cols,
            values: s.head_rows(&s.weights, head)?,
            scale: ColourScale::Sequential,
        },
        MatrixPanel {
            title: format!("4. output weights·V ({l}×{dv})"),
            rows,
            columns: features,
            values: s.head_rows(&s.blended, head)?,
            scale: ColourScale::Diverging,
        },
    ];
    let title = format!(
        "{}, layer {} of {}, head {head} of {}",
        e.attention.describe(),
        e.layer,
        e.num_layers,
        s.num_heads
    );
    save_steps(&title, &panels, path)?;
    Ok(())
}

/// Explains block `attention` of `layer` of the number translator on `text`. Errors when the
/// text is not an English number the translator takes (the reason from its parser) or the
/// layer does not exist.
fn explain_number_translator(
    translator: &Translator,
    text: &str,
    attention: AttentionUse,
    layer: usize,
) -> candle::Result<Explanation> {
    let example = translator.teacher_forcing(text)?;
    Explanation::of_model(translator.model(), example, attention, layer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_matrix_wider_than_the_width_is_cut_with_a_note_and_no_line_is_longer() {
        let cols: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
        let rows = strings(&["alpha", "beta"]);
        let values = vec![vec![1.2345f32; 30], vec![-0.5; 30]];
        let text = format_matrix(&rows, &cols, &cells(&values, 2), 3, 60);
        for line in text.lines() {
            assert!(line.chars().count() <= 60, "{line:?} is too long");
        }
        assert!(text.contains("more columns not shown"), "{text}");
        let full = format_matrix(&rows, &cols, &cells(&values, 2), 3, 1000);
        assert!(!full.contains("not shown"));
        assert_eq!(full.lines().count(), 3);
        assert!(full.lines().nth(1).unwrap().contains("1.23"));
    }

    #[test]
    fn numbers_labels_and_prose_are_tidy() {
        assert_eq!(number(-0.0001, 2), "0.00");
        assert_eq!(number(f32::NEG_INFINITY, 2), "-inf");
        assert_eq!(number(-1.256, 2), "-1.26");
        assert_eq!(label("abcdefghijklmnop", 5), "abcd…");
        let w = wrap("one two three four five six", 10, 2);
        assert!(w.lines().all(|l| l.chars().count() <= 10), "{w}");
        assert_eq!(w, "one two\n  three\n  four\n  five six");
        assert_eq!(wrap("   lead kept", 80, 0), "   lead kept");
    }
}
