//! `attn inspect`: what a safetensors file or a torch checkpoint holds and which layout it
//! follows.

use candle_attention::weights::PthCheckpoint;
use candle_attention::{MhaWeightsInfo, TensorFile};
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// A .safetensors file, a torch checkpoint (pytorch_model.bin, *.pt: a zip archive written
    /// by torch.save), or a Hugging Face model directory (MarianMT, M2M100 / NLLB-200, mBART).
    file: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    if args.file.is_dir() {
        return crate::pretrained::inspect_dir(&args.file, args.json);
    }
    if is_torch_checkpoint(&args.file) {
        return inspect_pth(&args.file, args.json);
    }
    let file = TensorFile::open(&args.file)?;
    let tensors = file.summaries();
    let parameters: usize = tensors.iter().map(|t| t.elem_count()).sum();
    let blocks = MhaWeightsInfo::find_all(&file);
    let layout = overall_layout(&blocks);
    if args.json {
        let json = serde_json::json!({
            "file": file.origin(),
            "tensors": tensors.iter().map(|t| serde_json::json!({
                "name": t.name, "dtype": t.dtype, "shape": t.shape, "parameters": t.elem_count(),
            })).collect::<Vec<_>>(),
            "parameters": parameters,
            "layout": layout,
            "attention_blocks": blocks.iter().map(|b| match b {
                Ok(b) => serde_json::json!({
                    "prefix": b.prefix, "layout": b.layout.describe(), "embed_dim": b.embed_dim,
                    "kdim": b.kdim, "vdim": b.vdim, "bias": b.bias, "add_bias_kv": b.add_bias_kv,
                    "parameters": b.parameters,
                }),
                Err(e) => serde_json::json!({ "error": e.to_string() }),
            }).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    println!(
        "{}: {} tensors, {} parameters",
        file.origin(),
        tensors.len(),
        parameters
    );
    let width = tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!("{:width$}  {:5}  shape", "name", "dtype");
    for t in &tensors {
        println!("{:width$}  {:5}  {:?}", t.name, t.dtype, t.shape);
    }
    println!("layout: {layout}");
    for block in &blocks {
        match block {
            Ok(b) => println!(
                "attention block '{}': {}, embed_dim {}, kdim {}, vdim {}, bias {}, bias_kv {}, {} parameters",
                b.prefix, b.layout.describe(), b.embed_dim, b.kdim, b.vdim, yes_no(b.bias), yes_no(b.add_bias_kv), b.parameters
            ),
            Err(e) => println!("attention block with inconsistent weights: {e}"),
        }
    }
    Ok(())
}

/// A torch checkpoint by its extension, or by the zip signature of a file not named
/// `.safetensors`.
fn is_torch_checkpoint(path: &Path) -> bool {
    use std::io::Read;
    match path.extension().and_then(|e| e.to_str()) {
        Some("safetensors") => false,
        Some("bin" | "pt" | "pth") => true,
        _ => {
            let mut magic = [0u8; 4];
            std::fs::File::open(path)
                .and_then(|mut f| f.read_exact(&mut magic))
                .is_ok()
                && magic == *b"PK\x03\x04"
        }
    }
}

/// `attn inspect FILE.bin`: the tensors of a torch checkpoint, validated by the reader when it
/// opens (an empty or lying checkpoint is an error here, not a table).
fn inspect_pth(path: &Path, json: bool) -> anyhow::Result<()> {
    let ckpt = PthCheckpoint::open(path)?;
    let infos: Vec<(&str, &candle_attention::weights::PthTensorInfo)> = ckpt
        .names()
        .into_iter()
        .filter_map(|n| ckpt.info(n).map(|i| (n, i)))
        .collect();
    let parameters: usize = infos.iter().map(|(_, i)| i.elem_count()).sum();
    if json {
        let json = serde_json::json!({
            "file": ckpt.origin(),
            "format": "torch zip checkpoint",
            "tensors": infos.iter().map(|(n, i)| serde_json::json!({
                "name": n, "dtype": i.torch_dtype(), "shape": i.shape(),
                "parameters": i.elem_count(),
            })).collect::<Vec<_>>(),
            "parameters": parameters,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    println!(
        "{}: torch checkpoint, {} tensors, {} parameters",
        ckpt.origin(),
        infos.len(),
        parameters
    );
    let width = infos.iter().map(|(n, _)| n.len()).max().unwrap_or(4).max(4);
    println!("{:width$}  {:8}  shape", "name", "dtype");
    for (n, i) in &infos {
        println!("{:width$}  {:8}  {:?}", n, i.torch_dtype(), i.shape());
    }
    Ok(())
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// One line for the whole file: a single block's layout, several blocks, or none.
fn overall_layout(blocks: &[candle::Result<MhaWeightsInfo>]) -> String {
    let ok: Vec<&MhaWeightsInfo> = blocks.iter().filter_map(|b| b.as_ref().ok()).collect();
    match ok.as_slice() {
        [] if blocks.is_empty() => "no attention weights recognised".to_string(),
        [] => "attention weights with inconsistent shapes".to_string(),
        [one] => one.layout.describe().to_string(),
        many => {
            let mut kinds: Vec<&str> = many.iter().map(|b| b.layout.describe()).collect();
            kinds.sort();
            kinds.dedup();
            format!("{} attention blocks: {}", many.len(), kinds.join("; "))
        }
    }
}
