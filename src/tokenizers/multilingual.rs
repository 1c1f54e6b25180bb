//! Exact, pure-Rust tokenizers of the multilingual translation families, as transformers 5.24
//! builds them from a hub directory WITHOUT `tokenizer.json`:
//!
//! * [`NllbTokenizer`] (NLLB-200): transformers converts `sentencepiece.bpe.model` into a
//!   `tokenizers` BPE (merges generated from the piece order, `fuse_unk`), ids shifted for
//!   fairseq (`<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3, piece `i` at `i + 1`), normaliser
//!   `Precompiled` + runs of spaces collapsed, Metaspace pre-tokenizer (`▁` prepended to every
//!   chunk, words cut at `▁`), the added tokens (language codes, `<mask>`) matched in the text;
//!   source `[src] pieces </s>`, or `pieces </s> [src]` with `legacy_behaviour`;
//! * [`MBart50Tokenizer`] (mBART-50): the same pipeline on a `tokenizers` Unigram built from the
//!   file (a unigram model despite its name), with the 52 language codes and `<mask>` appended
//!   to the model's own vocabulary; `[src] pieces </s>`;
//! * [`M2M100Tokenizer`] (M2M100): still transformers' Python tokenizer on top of the
//!   `sentencepiece` library: the file's pieces mapped through `vocab.json` (`<unk>` for those
//!   it lacks), `__xx__` language tokens after it, `[src] pieces </s>`, decoding through
//!   sentencepiece with special tokens written as they are and the result stripped.
//!
//! A `tokenizer.json` is not needed; when the directory has one, NLLB-200 and mBART-50 take
//! the vocabulary, the merges (or unigram scores) and the charsmap from it, as transformers
//! does (the normaliser, pre-tokenizer and decoder stay the class's own).
//!
//! All three implement [`MultilingualTokenizer`]; [`load_multilingual_tokenizer`] picks the
//! family from `tokenizer_config.json`. Checked against transformers 5.24.0 on the fixtures of
//! `tests/fixtures/make_multilingual_tokenizer_fixtures.py`.

use super::added_tokens::AddedTokenTrie;
use super::files::Vocab;
use super::hf_models::{HfBpe, HfUnigram, Precompiled};
use super::marian::{clean_up_tokenization, py_strip, BatchEncoding};
use super::sentencepiece::model_proto::ModelProto;
use super::sentencepiece::{SentencePieceModel, SPACE_SYMBOL};
use candle::{Error, Result};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// The NLLB-200 language codes (`FAIRSEQ_LANGUAGE_CODES` of transformers' `tokenization_nllb`).
pub const NLLB_LANGUAGE_CODES: [&str; 202] = [
    "ace_Arab", "ace_Latn", "acm_Arab", "acq_Arab", "aeb_Arab", "afr_Latn", "ajp_Arab", "aka_Latn",
    "amh_Ethi", "apc_Arab", "arb_Arab", "ars_Arab", "ary_Arab", "arz_Arab", "asm_Beng", "ast_Latn",
    "awa_Deva", "ayr_Latn", "azb_Arab", "azj_Latn", "bak_Cyrl", "bam_Latn", "ban_Latn", "bel_Cyrl",
    "bem_Latn", "ben_Beng", "bho_Deva", "bjn_Arab", "bjn_Latn", "bod_Tibt", "bos_Latn", "bug_Latn",
    "bul_Cyrl", "cat_Latn", "ceb_Latn", "ces_Latn", "cjk_Latn", "ckb_Arab", "crh_Latn", "cym_Latn",
    "dan_Latn", "deu_Latn", "dik_Latn", "dyu_Latn", "dzo_Tibt", "ell_Grek", "eng_Latn", "epo_Latn",
    "est_Latn", "eus_Latn", "ewe_Latn", "fao_Latn", "pes_Arab", "fij_Latn", "fin_Latn", "fon_Latn",
    "fra_Latn", "fur_Latn", "fuv_Latn", "gla_Latn", "gle_Latn", "glg_Latn", "grn_Latn", "guj_Gujr",
    "hat_Latn", "hau_Latn", "heb_Hebr", "hin_Deva", "hne_Deva", "hrv_Latn", "hun_Latn", "hye_Armn",
    "ibo_Latn", "ilo_Latn", "ind_Latn", "isl_Latn", "ita_Latn", "jav_Latn", "jpn_Jpan", "kab_Latn",
    "kac_Latn", "kam_Latn", "kan_Knda", "kas_Arab", "kas_Deva", "kat_Geor", "knc_Arab", "knc_Latn",
    "kaz_Cyrl", "kbp_Latn", "kea_Latn", "khm_Khmr", "kik_Latn", "kin_Latn", "kir_Cyrl", "kmb_Latn",
    "kon_Latn", "kor_Hang", "kmr_Latn", "lao_Laoo", "lvs_Latn", "lij_Latn", "lim_Latn", "lin_Latn",
    "lit_Latn", "lmo_Latn", "ltg_Latn", "ltz_Latn", "lua_Latn", "lug_Latn", "luo_Latn", "lus_Latn",
    "mag_Deva", "mai_Deva", "mal_Mlym", "mar_Deva", "min_Latn", "mkd_Cyrl", "plt_Latn", "mlt_Latn",
    "mni_Beng", "khk_Cyrl", "mos_Latn", "mri_Latn", "zsm_Latn", "mya_Mymr", "nld_Latn", "nno_Latn",
    "nob_Latn", "npi_Deva", "nso_Latn", "nus_Latn", "nya_Latn", "oci_Latn", "gaz_Latn", "ory_Orya",
    "pag_Latn", "pan_Guru", "pap_Latn", "pol_Latn", "por_Latn", "prs_Arab", "pbt_Arab", "quy_Latn",
    "ron_Latn", "run_Latn", "rus_Cyrl", "sag_Latn", "san_Deva", "sat_Beng", "scn_Latn", "shn_Mymr",
    "sin_Sinh", "slk_Latn", "slv_Latn", "smo_Latn", "sna_Latn", "snd_Arab", "som_Latn", "sot_Latn",
    "spa_Latn", "als_Latn", "srd_Latn", "srp_Cyrl", "ssw_Latn", "sun_Latn", "swe_Latn", "swh_Latn",
    "szl_Latn", "tam_Taml", "tat_Cyrl", "tel_Telu", "tgk_Cyrl", "tgl_Latn", "tha_Thai", "tir_Ethi",
    "taq_Latn", "taq_Tfng", "tpi_Latn", "tsn_Latn", "tso_Latn", "tuk_Latn", "tum_Latn", "tur_Latn",
    "twi_Latn", "tzm_Tfng", "uig_Arab", "ukr_Cyrl", "umb_Latn", "urd_Arab", "uzn_Latn", "vec_Latn",
    "vie_Latn", "war_Latn", "wol_Latn", "xho_Latn", "ydd_Hebr", "yor_Latn", "yue_Hant", "zho_Hans",
    "zho_Hant", "zul_Latn",
];

/// The mBART-50 language codes (`FAIRSEQ_LANGUAGE_CODES` of `tokenization_mbart50`).
pub const MBART50_LANGUAGE_CODES: [&str; 52] = [
    "ar_AR", "cs_CZ", "de_DE", "en_XX", "es_XX", "et_EE", "fi_FI", "fr_XX", "gu_IN", "hi_IN",
    "it_IT", "ja_XX", "kk_KZ", "ko_KR", "lt_LT", "lv_LV", "my_MM", "ne_NP", "nl_XX", "ro_RO",
    "ru_RU", "si_LK", "tr_TR", "vi_VN", "zh_CN", "af_ZA", "az_AZ", "bn_IN", "fa_IR", "he_IL",
    "hr_HR", "id_ID", "ka_GE", "km_KH", "mk_MK", "ml_IN", "mn_MN", "mr_IN", "pl_PL", "ps_AF",
    "pt_XX", "sv_SE", "sw_KE", "ta_IN", "te_IN", "th_TH", "tl_XX", "uk_UA", "ur_PK", "xh_ZA",
    "gl_ES", "sl_SI",
];

/// The M2M100 language codes (`FAIRSEQ_LANGUAGE_CODES["m2m100"]`), written `__xx__` as tokens.
pub const M2M100_LANGUAGE_CODES: [&str; 100] = [
    "af", "am", "ar", "ast", "az", "ba", "be", "bg", "bn", "br", "bs", "ca", "ceb", "cs", "cy",
    "da", "de", "el", "en", "es", "et", "fa", "ff", "fi", "fr", "fy", "ga", "gd", "gl", "gu", "ha",
    "he", "hi", "hr", "ht", "hu", "hy", "id", "ig", "ilo", "is", "it", "ja", "jv", "ka", "kk",
    "km", "kn", "ko", "lb", "lg", "ln", "lo", "lt", "lv", "mg", "mk", "ml", "mn", "mr", "ms", "my",
    "ne", "nl", "no", "ns", "oc", "or", "pa", "pl", "ps", "pt", "ro", "ru", "sd", "si", "sk", "sl",
    "so", "sq", "sr", "ss", "su", "sv", "sw", "ta", "th", "tl", "tn", "tr", "uk", "ur", "uz", "vi",
    "wo", "xh", "yi", "yo", "zh", "zu",
];

/// The WMT21 M2M100 language codes (`language_codes: "wmt21"`).
pub const M2M100_WMT21_LANGUAGE_CODES: [&str; 8] = ["en", "ha", "is", "ja", "cs", "ru", "zh", "de"];

/// The family of a multilingual tokenizer directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultilingualFamily {
    /// NLLB-200 (`NllbTokenizer`).
    Nllb,
    /// M2M100 (`M2M100Tokenizer`).
    M2M100,
    /// mBART-50 (`MBart50Tokenizer`).
    MBart50,
}

impl MultilingualFamily {
    /// The family's name as users know it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Nllb => "NLLB-200",
            Self::M2M100 => "M2M100",
            Self::MBart50 => "mBART-50",
        }
    }
}

/// What the three families share: encoding for a source or target language, decoding, and
/// the vocabulary's special ids. Ids, tokens and texts are transformers 5.24's.
pub trait MultilingualTokenizer: std::fmt::Debug + Send + Sync {
    /// The family.
    fn family(&self) -> MultilingualFamily;

    /// The language codes the tokenizer knows, as the family spells them (`eng_Latn`, `en`,
    /// `en_XX`), in the family's order.
    fn language_codes(&self) -> Vec<String>;

    /// The id of a language's token (`forced_bos_token_id` for that target language). An
    /// unknown code is an error that lists close matches.
    fn lang_id(&self, code: &str) -> Result<u32>;

    /// The tokens of `text` without special tokens around it (`tokenizer.tokenize(text)`).
    fn tokenize(&self, text: &str) -> Result<Vec<String>>;

    /// The ids of `text` with the source language's special tokens, as
    /// `tokenizer(text)["input_ids"]` with `tokenizer.src_lang = src_lang`.
    fn encode(&self, text: &str, src_lang: &str) -> Result<Vec<u32>>;

    /// The ids of `text` as a target (`tokenizer(text_target=text)` with `tgt_lang`).
    fn encode_target(&self, text: &str, tgt_lang: &str) -> Result<Vec<u32>>;

    /// Decodes ids (`tokenizer.decode(ids, skip_special_tokens=...)`); with
    /// `skip_special_tokens` the language codes go too.
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String>;

    /// The token of an id (`convert_ids_to_tokens`), `None` where transformers gives `None`.
    fn id_to_token(&self, id: u32) -> Option<String>;

    /// The id of a token (added tokens, then the vocabulary), `None` if unknown.
    fn token_to_id(&self, token: &str) -> Option<u32>;

    /// `tokenizer.vocab_size`.
    fn vocab_size(&self) -> usize;

    /// `len(tokenizer)`: the vocabulary with the added tokens.
    fn len(&self) -> usize;

    /// Whether [`len`](Self::len) is 0 (never, for a loaded tokenizer).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Id of `<pad>`.
    fn pad_id(&self) -> u32;

    /// Id of `</s>` (also the decoder start token of these models).
    fn eos_id(&self) -> u32;

    /// Id of `<unk>`.
    fn unk_id(&self) -> u32;

    /// Id of `<s>`.
    fn bos_id(&self) -> u32;

    /// The ids `decode(.., true)` drops, sorted: `all_special_ids` for the hub's files (for
    /// NLLB-200 and mBART-50, precisely the added tokens marked special).
    fn special_ids(&self) -> Vec<u32>;

    /// Encodes a batch for `src_lang` and right-pads it with `<pad>` to the longest, as
    /// `tokenizer(texts, padding=True)`.
    fn encode_batch_padded(&self, texts: &[&str], src_lang: &str) -> Result<BatchEncoding> {
        let seqs = texts
            .iter()
            .map(|t| self.encode(t, src_lang))
            .collect::<Result<Vec<_>>>()?;
        let len = seqs.iter().map(Vec::len).max().unwrap_or(0);
        let attention_mask = seqs
            .iter()
            .map(|s| {
                let mut m = vec![1u32; s.len()];
                m.resize(len, 0);
                m
            })
            .collect();
        let pad = self.pad_id();
        let input_ids = seqs
            .into_iter()
            .map(|mut s| {
                s.resize(len, pad);
                s
            })
            .collect();
        Ok(BatchEncoding {
            input_ids,
            attention_mask,
        })
    }
}

/// Loads the tokenizer of a multilingual directory, the family chosen by
/// `tokenizer_config.json`'s `tokenizer_class` (else by the files: `vocab.json` means
/// M2M100, a unigram `sentencepiece.bpe.model` mBART-50, a BPE one NLLB).
pub fn load_multilingual_tokenizer(
    dir: impl AsRef<Path>,
) -> Result<Box<dyn MultilingualTokenizer>> {
    let dir = dir.as_ref();
    Ok(match detect_family(dir)? {
        MultilingualFamily::Nllb => Box::new(NllbTokenizer::from_dir(dir)?),
        MultilingualFamily::M2M100 => Box::new(M2M100Tokenizer::from_dir(dir)?),
        MultilingualFamily::MBart50 => Box::new(MBart50Tokenizer::from_dir(dir)?),
    })
}

/// The family of a tokenizer directory (see [`load_multilingual_tokenizer`]).
pub fn detect_family(dir: &Path) -> Result<MultilingualFamily> {
    let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or_default();
    if let Some(class) = config.get("tokenizer_class").and_then(Value::as_str) {
        let class = class.trim_end_matches("Fast");
        return match class {
            "NllbTokenizer" => Ok(MultilingualFamily::Nllb),
            "M2M100Tokenizer" => Ok(MultilingualFamily::M2M100),
            "MBart50Tokenizer" => Ok(MultilingualFamily::MBart50),
            other => Err(Error::Msg(format!(
                "{}: tokenizer_class {other:?} is not a multilingual family this crate \
                 supports (NllbTokenizer, M2M100Tokenizer, MBart50Tokenizer)",
                dir.display()
            ))),
        };
    }
    if dir.join("vocab.json").is_file() {
        return Ok(MultilingualFamily::M2M100);
    }
    let spm = dir.join("sentencepiece.bpe.model");
    if !spm.is_file() {
        return Err(Error::Msg(format!(
            "{}: no tokenizer_config.json naming the tokenizer class and no \
             sentencepiece.bpe.model: not an NLLB-200, M2M100 or mBART-50 directory",
            dir.display()
        )));
    }
    let proto = read_proto(&spm)?;
    Ok(if proto.trainer_spec.model_type == 1 {
        MultilingualFamily::MBart50
    } else {
        MultilingualFamily::Nllb
    })
}

// ---------------------------------------------------------------------------------------------
// Files

fn read_json(path: &Path) -> Result<Option<Map<String, Value>>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Msg(format!("cannot read {}: {e}", path.display())))?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(m)) => Ok(Some(m)),
        Ok(_) => Err(Error::Msg(format!("{}: not a JSON object", path.display()))),
        Err(e) => Err(Error::Msg(format!("{}: invalid JSON: {e}", path.display()))),
    }
}

fn read_proto(path: &Path) -> Result<ModelProto> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::Msg(format!("cannot read {}: {e}", path.display())))?;
    let proto =
        ModelProto::parse(&bytes).map_err(|e| Error::Msg(format!("{}: {e}", path.display())))?;
    if proto.pieces.is_empty() {
        return Err(Error::Msg(format!(
            "{}: no pieces (empty or not a sentencepiece model)",
            path.display()
        )));
    }
    Ok(proto)
}

/// The parts of a `tokenizer.json` transformers 5.24 takes when the directory has one (for
/// classes with their own `__init__`, as these): the model's vocabulary and merges and the
/// normaliser's precompiled charsmap. Its pre-tokenizer, decoder and added tokens are not used.
#[derive(serde::Deserialize)]
struct TokenizerJson {
    model: TokenizerJsonModel,
    #[serde(default)]
    normalizer: Option<Value>,
}

#[derive(serde::Deserialize)]
struct TokenizerJsonModel {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    vocab: TokenizerJsonVocab,
    #[serde(default)]
    merges: Vec<TokenizerJsonMerge>,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum TokenizerJsonVocab {
    Map(HashMap<String, u32>),
    Scored(Vec<(String, f64)>),
    List(Vec<String>),
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum TokenizerJsonMerge {
    Joined(String),
    Pair(String, String),
}

impl TokenizerJson {
    fn read(path: &Path) -> Result<Option<Self>> {
        if !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Msg(format!("cannot read {}: {e}", path.display())))?;
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::Msg(format!("{}: not a tokenizer.json: {e}", path.display())))
    }

    /// The `Precompiled` normaliser's charsmap (alone or in a `Sequence`), decoded.
    fn precompiled_charsmap(&self) -> Result<Option<Vec<u8>>> {
        let Some(n) = &self.normalizer else {
            return Ok(None);
        };
        let list: Vec<&Value> = match n.get("type").and_then(Value::as_str) {
            Some("Sequence") => n
                .get("normalizers")
                .and_then(Value::as_array)
                .map(|a| a.iter().collect())
                .unwrap_or_default(),
            _ => vec![n],
        };
        for n in list {
            if n.get("type").and_then(Value::as_str) == Some("Precompiled") {
                if let Some(b64) = n.get("precompiled_charsmap").and_then(Value::as_str) {
                    return base64_decode(b64).map(Some);
                }
            }
        }
        Ok(None)
    }

    fn merges(&self) -> Result<Vec<(String, String)>> {
        self.model
            .merges
            .iter()
            .map(|m| match m {
                TokenizerJsonMerge::Pair(a, b) => Ok((a.clone(), b.clone())),
                TokenizerJsonMerge::Joined(s) => {
                    let mut parts = s.split(' ');
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some(a), Some(b), None) => Ok((a.to_string(), b.to_string())),
                        _ => Err(Error::Msg(format!(
                            "tokenizer.json: merge {s:?} is not two tokens"
                        ))),
                    }
                }
            })
            .collect()
    }
}

/// Standard base64 (as `base64.b64decode`), padding optional.
fn base64_decode(s: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            b'\n' | b'\r' => continue,
            _ => {
                return Err(Error::Msg(format!(
                    "tokenizer.json: invalid base64 byte {c:#x} in precompiled_charsmap"
                )))
            }
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

/// Id to token of a token-to-id map (ids without a token stay empty).
fn invert(map: &HashMap<String, u32>) -> Vec<String> {
    let n = map.values().max().map_or(0, |&m| m as usize + 1);
    let mut out = vec![String::new(); n];
    for (t, &id) in map {
        out[id as usize] = t.clone();
    }
    out
}

fn require_files(dir: &Path, family: MultilingualFamily, files: &[&str]) -> Result<()> {
    let missing: Vec<&str> = files
        .iter()
        .copied()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::Msg(format!(
        "{} is not a complete {} tokenizer directory: missing {} (tokenizer.json is not needed, \
         these are)",
        dir.display(),
        family.name(),
        missing.join(", ")
    )))
}

/// An added token as transformers keeps it (`AddedToken`).
#[derive(Debug, Clone, PartialEq)]
struct AddedTok {
    content: String,
    special: bool,
    lstrip: bool,
    normalized: bool,
}

/// The settings of `tokenizer_config.json` and `special_tokens_map.json` these tokenizers use.
#[derive(Debug, Clone, Default)]
struct FamilyConfig {
    config: Map<String, Value>,
    /// `special_tokens_map.json`, read only without `added_tokens_decoder`.
    map: Map<String, Value>,
    path: std::path::PathBuf,
}

impl FamilyConfig {
    fn read(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer_config.json");
        let config = read_json(&path)?.unwrap_or_default();
        let map = if config.contains_key("added_tokens_decoder") {
            Map::new()
        } else {
            read_json(&dir.join("special_tokens_map.json"))?.unwrap_or_default()
        };
        Ok(Self { config, map, path })
    }

    fn str(&self, key: &str) -> Option<&str> {
        self.config.get(key).and_then(Value::as_str)
    }

    fn bool(&self, key: &str) -> Option<bool> {
        self.config.get(key).and_then(Value::as_bool)
    }

    /// A token given as a string (`default` flags) or an `AddedToken` object.
    fn token(&self, v: &Value, what: &str, default: &AddedTok) -> Result<AddedTok> {
        match v {
            Value::String(s) => Ok(AddedTok {
                content: s.clone(),
                ..default.clone()
            }),
            Value::Object(o) => {
                for flag in ["rstrip", "single_word"] {
                    if o.get(flag).and_then(Value::as_bool) == Some(true) {
                        return Err(Error::Msg(format!(
                            "{}: {what} sets {flag}=true, which this tokenizer does not implement",
                            self.path.display()
                        )));
                    }
                }
                let content = o
                    .get("content")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        Error::Msg(format!(
                            "{}: {what} has no string \"content\"",
                            self.path.display()
                        ))
                    })?
                    .to_string();
                let flag = |k: &str, d: bool| o.get(k).and_then(Value::as_bool).unwrap_or(d);
                let special = flag("special", false);
                Ok(AddedTok {
                    content,
                    special,
                    lstrip: flag("lstrip", false),
                    // AddedToken's default: normalized = not special.
                    normalized: flag("normalized", !special),
                })
            }
            _ => Err(Error::Msg(format!(
                "{}: {what} is neither a string nor a token object",
                self.path.display()
            ))),
        }
    }

    /// A named special token (`"mask_token"`, ...): the config's, else the map's, else
    /// `default` (`None` when the config sets it to null).
    fn named(&self, name: &str, default: &AddedTok) -> Result<Option<AddedTok>> {
        let v = match self.config.get(name) {
            Some(Value::Null) => return Ok(None),
            Some(v) => Some(v),
            None => self.map.get(name),
        };
        match v {
            Some(v) => self.token(v, name, default).map(Some),
            None => Ok(Some(default.clone())),
        }
    }

    /// `extra_special_tokens` / `additional_special_tokens` of `tokenizer_config.json`, then
    /// (with `with_map`) of `special_tokens_map.json`. transformers 5.24 reads the map's, but
    /// for NLLB-200 and mBART-50 the sentencepiece conversion (`SentencePieceExtractor`)
    /// overwrites `additional_special_tokens` with the file's control pieces, so only the
    /// config's (loaded as `extra_special_tokens`) count there.
    fn extra(&self, with_map: bool) -> Result<Option<Vec<AddedTok>>> {
        let special = AddedTok {
            content: String::new(),
            special: true,
            lstrip: false,
            normalized: false,
        };
        let sources: &[&Map<String, Value>] = if with_map {
            &[&self.config, &self.map]
        } else {
            &[&self.config]
        };
        for source in sources {
            for key in ["extra_special_tokens", "additional_special_tokens"] {
                match source.get(key) {
                    None | Some(Value::Null) => {}
                    Some(Value::Array(items)) => {
                        return items
                            .iter()
                            .map(|v| self.token(v, "an extra special token", &special))
                            .collect::<Result<Vec<_>>>()
                            .map(Some);
                    }
                    Some(_) => {
                        return Err(Error::Msg(format!(
                            "{}: {key} must be a list",
                            self.path.display()
                        )))
                    }
                }
            }
        }
        Ok(None)
    }

    /// `added_tokens_decoder`, sorted by id.
    fn decoder(&self) -> Result<Vec<(u32, AddedTok)>> {
        let mut out = Vec::new();
        if let Some(Value::Object(dec)) = self.config.get("added_tokens_decoder") {
            let plain = AddedTok {
                content: String::new(),
                special: false,
                lstrip: false,
                normalized: true,
            };
            for (id, v) in dec {
                let id: u32 = id.parse().map_err(|_| {
                    Error::Msg(format!(
                        "{}: added_tokens_decoder key {id:?} is not an id",
                        self.path.display()
                    ))
                })?;
                out.push((id, self.token(v, "an added token", &plain)?));
            }
        }
        out.sort_by_key(|(id, _)| *id);
        Ok(out)
    }
}

/// The close matches of an unknown language code, for the error message.
fn unknown_code_error(family: MultilingualFamily, code: &str, known: &[String]) -> Error {
    fn distance(a: &str, b: &str) -> usize {
        let a: Vec<char> = a.to_lowercase().chars().collect();
        let b: Vec<char> = b.to_lowercase().chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for i in 1..=a.len() {
            let mut cur = vec![i; b.len() + 1];
            for j in 1..=b.len() {
                let cost = usize::from(a[i - 1] != b[j - 1]);
                cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            }
            prev = cur;
        }
        prev[b.len()]
    }
    let lower = code.to_lowercase();
    let mut close: Vec<(usize, &String)> = known
        .iter()
        .map(|k| {
            let kl = k.to_lowercase();
            let d = if kl.starts_with(&lower) || lower.starts_with(&kl) && !kl.is_empty() {
                0
            } else {
                distance(code, k)
            };
            (d, k)
        })
        .filter(|(d, _)| *d <= 2)
        .collect();
    close.sort();
    let close: Vec<&str> = close.iter().take(8).map(|(_, k)| k.as_str()).collect();
    let hint = if close.is_empty() {
        "no close match".to_string()
    } else {
        format!("close matches: {}", close.join(", "))
    };
    Error::Msg(format!(
        "unknown {} language code {code:?} ({hint}); the tokenizer knows {} codes: \
         `language_codes()` lists them all (`attn inspect DIR` prints them)",
        family.name(),
        known.len()
    ))
}

// ---------------------------------------------------------------------------------------------
// The `tokenizers` pipeline of NLLB-200 and mBART-50

#[derive(Debug, Clone)]
enum HfModel {
    Bpe(HfBpe),
    Unigram(HfUnigram),
}

/// The added tokens of a `tokenizers` pipeline, matched leftmost-longest.
#[derive(Debug, Clone, Default)]
struct AddedVocab {
    by_id: HashMap<u32, AddedTok>,
    by_content: HashMap<String, u32>,
    /// The tokens matched in the raw text / in the normalised text.
    raw: Matcher,
    normalized: Matcher,
}

/// `(content, id, lstrip)` of added tokens, with the bytes they can start with.
#[derive(Debug, Clone)]
struct Matcher {
    tokens: Vec<(String, u32, bool)>,
    first_bytes: [bool; 256],
}

impl Default for Matcher {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            first_bytes: [false; 256],
        }
    }
}

impl Matcher {
    fn push(&mut self, entry: (String, u32, bool)) {
        self.first_bytes[entry.0.as_bytes()[0] as usize] = true;
        self.tokens.push(entry);
    }
}

enum Chunk<'a> {
    Text(&'a str),
    Token(u32),
}

impl AddedVocab {
    /// `add_tokens`: a token the model has keeps its id, a new one gets the next id.
    fn add(&mut self, tokens: Vec<AddedTok>, model_vocab: &HashMap<String, u32>) {
        let vocab_size = model_vocab.len() as u32;
        let mut next_id = match self.by_id.keys().max() {
            Some(&max) if max >= vocab_size || vocab_size == 0 => max + 1,
            _ => vocab_size,
        };
        for t in tokens {
            if t.content.is_empty() {
                continue;
            }
            if let Some(id) = self.by_content.get(&t.content) {
                if self.by_id.get(id) == Some(&t) {
                    continue;
                }
            }
            let id = match self
                .by_content
                .get(&t.content)
                .or_else(|| model_vocab.get(&t.content))
            {
                Some(&id) => id,
                None => {
                    next_id += 1;
                    next_id - 1
                }
            };
            self.by_content.insert(t.content.clone(), id);
            self.by_id.insert(id, t);
        }
        self.raw = Matcher::default();
        self.normalized = Matcher::default();
        let mut ids: Vec<&u32> = self.by_id.keys().collect();
        ids.sort();
        for &id in ids {
            let t = &self.by_id[&id];
            let entry = (t.content.clone(), id, t.lstrip);
            if t.normalized {
                self.normalized.push(entry);
            } else {
                self.raw.push(entry);
            }
        }
    }

    /// `find_matches`: leftmost-longest matches of `tokens` in `text`, `lstrip` eating the
    /// whitespace before a token (not before the previous match's end).
    fn split<'a>(matcher: &Matcher, text: &'a str) -> Vec<Chunk<'a>> {
        let mut out = Vec::new();
        let mut start_offset = 0;
        let mut pos = 0;
        while pos < text.len() {
            let rest = &text[pos..];
            if !matcher.first_bytes[rest.as_bytes()[0] as usize] {
                pos += rest.chars().next().map_or(1, char::len_utf8);
                continue;
            }
            let best = matcher
                .tokens
                .iter()
                .filter(|(c, _, _)| rest.starts_with(c.as_str()))
                .max_by_key(|(c, _, _)| c.len());
            match best {
                Some((content, id, lstrip)) => {
                    let mut start = pos;
                    if *lstrip {
                        let trimmed = text[..pos].trim_end_matches(char::is_whitespace).len();
                        start = trimmed.max(start_offset);
                    }
                    if start_offset < start {
                        out.push(Chunk::Text(&text[start_offset..start]));
                    }
                    out.push(Chunk::Token(*id));
                    pos += content.len();
                    start_offset = pos;
                }
                None => pos += rest.chars().next().map_or(1, char::len_utf8),
            }
        }
        if start_offset < text.len() {
            out.push(Chunk::Text(&text[start_offset..]));
        }
        out
    }
}

/// A `tokenizers.Tokenizer` as transformers builds it for NLLB-200 and mBART-50.
#[derive(Debug, Clone)]
struct HfPipeline {
    precompiled: Option<Precompiled>,
    /// `Replace(" {2,}", " ")` after it (NLLB has no normaliser at all without a charsmap).
    collapse_spaces: bool,
    model: HfModel,
    /// Model id to token.
    vocab: Vec<String>,
    vocab_map: HashMap<String, u32>,
    added: AddedVocab,
}

impl HfPipeline {
    /// `Precompiled` then `Replace(" {2,}", " ")` (the parts the tokenizer has).
    fn normalize(&self, text: &str) -> String {
        let text = match &self.precompiled {
            Some(p) => p.normalize(text),
            None => text.to_string(),
        };
        if !self.collapse_spaces {
            return text;
        }
        let mut out = String::with_capacity(text.len());
        let mut run = 0;
        for c in text.chars() {
            if c == ' ' {
                run += 1;
                if run == 1 {
                    out.push(' ');
                }
            } else {
                run = 0;
                out.push(c);
            }
        }
        out
    }

    /// Metaspace (`▁` for spaces, `▁` prepended, words cut before each `▁`), then the model.
    fn encode_chunk(&self, text: &str, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut s = text.replace(' ', SPACE_SYMBOL);
        if !s.starts_with(SPACE_SYMBOL) {
            s.insert_str(0, SPACE_SYMBOL);
        }
        let mut words: Vec<&str> = Vec::new();
        let mut start = 0;
        for (i, _) in s.match_indices(SPACE_SYMBOL) {
            if i > start {
                words.push(&s[start..i]);
            }
            start = i;
        }
        if start < s.len() {
            words.push(&s[start..]);
        }
        for w in words {
            match &self.model {
                HfModel::Bpe(b) => out.extend(b.encode_word(w)),
                HfModel::Unigram(u) => out.extend(u.encode_word(w)),
            }
        }
    }

    /// The ids of `text` without post-processing (`extract_and_normalize`, pre-tokenizer,
    /// model).
    fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        for chunk in AddedVocab::split(&self.added.raw, text) {
            match chunk {
                Chunk::Token(id) => out.push(id),
                Chunk::Text(t) => {
                    let normalized = self.normalize(t);
                    for c in AddedVocab::split(&self.added.normalized, &normalized) {
                        match c {
                            Chunk::Token(id) => out.push(id),
                            Chunk::Text(t) => self.encode_chunk(t, &mut out),
                        }
                    }
                }
            }
        }
        out
    }

    fn id_to_token(&self, id: u32) -> Option<&str> {
        self.added
            .by_id
            .get(&id)
            .map(|t| t.content.as_str())
            .or_else(|| {
                self.vocab
                    .get(id as usize)
                    .filter(|t| !t.is_empty())
                    .map(String::as_str)
            })
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.added
            .by_content
            .get(token)
            .or_else(|| self.vocab_map.get(token))
            .copied()
    }

    fn is_special(&self, id: u32) -> bool {
        self.added.by_id.get(&id).is_some_and(|t| t.special)
    }

    /// `Tokenizer.decode` with the Metaspace decoder: the first token loses its `▁`s, the
    /// others have them as spaces; unknown ids vanish.
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        let mut out = String::new();
        let mut first = true;
        for &id in ids {
            let Some(t) = self.id_to_token(id) else {
                continue;
            };
            if skip_special_tokens && self.is_special(id) {
                continue;
            }
            if first {
                out.push_str(&t.replace(SPACE_SYMBOL, ""));
                first = false;
            } else {
                out.push_str(&t.replace(SPACE_SYMBOL, " "));
            }
        }
        out
    }

    fn len(&self) -> usize {
        let extra = self
            .added
            .by_id
            .keys()
            .filter(|&&id| self.vocab.get(id as usize).is_none_or(String::is_empty))
            .count();
        self.vocab_map.len() + extra
    }

    fn special_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .added
            .by_id
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        ids
    }
}

/// The special tokens of a family: the named ones in transformers' order, with the defaults
/// the class gives them.
fn named_tokens(cfg: &FamilyConfig, mask: AddedTok) -> Result<Vec<(&'static str, AddedTok)>> {
    let special = |c: &str| AddedTok {
        content: c.to_string(),
        special: true,
        lstrip: false,
        normalized: false,
    };
    let defaults = [
        ("bos_token", special("<s>")),
        ("eos_token", special("</s>")),
        ("unk_token", special("<unk>")),
        ("sep_token", special("</s>")),
        ("pad_token", special("<pad>")),
        ("cls_token", special("<s>")),
        ("mask_token", mask),
    ];
    let mut out = Vec::new();
    for (name, default) in defaults {
        if let Some(mut t) = cfg.named(name, &default)? {
            // Named tokens are special whatever the file says.
            t.special = true;
            out.push((name, t));
        }
    }
    Ok(out)
}

fn named_content<'a>(
    named: &'a [(&'static str, AddedTok)],
    name: &str,
    default: &'a str,
) -> &'a str {
    named
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(default, |(_, t)| t.content.as_str())
}

/// `TokenizersBackend.__init__`'s added tokens: `added_tokens_decoder` (by id), then the named
/// special tokens and the extra ones that are not there yet.
fn build_added(
    cfg: &FamilyConfig,
    named: &[(&'static str, AddedTok)],
    extra: &[AddedTok],
    vocab: &HashMap<String, u32>,
) -> Result<AddedVocab> {
    let mut tokens: Vec<AddedTok> = cfg.decoder()?.into_iter().map(|(_, t)| t).collect();
    for t in named.iter().map(|(_, t)| t).chain(extra) {
        if !tokens.iter().any(|x| x.content == t.content) {
            tokens.push(t.clone());
        }
    }
    let mut added = AddedVocab::default();
    added.add(tokens, vocab);
    Ok(added)
}

// ---------------------------------------------------------------------------------------------
// NLLB-200

/// `transformers.NllbTokenizer` (5.24, built from `sentencepiece.bpe.model` and the JSON
/// configs), without Python: same ids, tokens and decoded text.
///
/// ```
/// use candle_attention::tokenizers::{MultilingualTokenizer, NllbTokenizer};
/// # fn main() -> candle::Result<()> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/multilingual_tokenizer/nllb");
/// let tok = NllbTokenizer::from_dir(dir)?; // e.g. "nllb-200-distilled-600M"
/// let ids = tok.encode("Hello world!", "eng_Latn")?;
/// assert_eq!(ids[0], tok.lang_id("eng_Latn")?); // [eng_Latn] pieces </s>
/// assert_eq!(*ids.last().unwrap(), tok.eos_id());
/// assert_eq!(tok.decode(&ids, true)?, "Hello world!");
/// assert!(tok.lang_id("eng_latn").unwrap_err().to_string().contains("eng_Latn"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct NllbTokenizer {
    pipe: HfPipeline,
    legacy_behaviour: bool,
    codes: Vec<String>,
    bos_id: u32,
    eos_id: u32,
    pad_id: u32,
    unk_id: u32,
    default_src_lang: String,
    default_tgt_lang: Option<String>,
}

impl NllbTokenizer {
    /// Loads an NLLB-200 directory: `sentencepiece.bpe.model`, `tokenizer_config.json` and
    /// `special_tokens_map.json`. When the directory also has a `tokenizer.json`, its
    /// vocabulary, merges and charsmap are used instead of the sentencepiece file's, as
    /// transformers does (then `sentencepiece.bpe.model` is not needed).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let json = TokenizerJson::read(&dir.join("tokenizer.json"))?;
        if json.is_none() {
            require_files(dir, MultilingualFamily::Nllb, &["sentencepiece.bpe.model"])?;
        }
        let cfg = FamilyConfig::read(dir)?;
        let mask = AddedTok {
            content: "<mask>".into(),
            special: true,
            lstrip: true,
            normalized: true,
        };
        let named = named_tokens(&cfg, mask)?;
        let (bos, pad, eos, unk) = (
            named_content(&named, "bos_token", "<s>").to_string(),
            named_content(&named, "pad_token", "<pad>").to_string(),
            named_content(&named, "eos_token", "</s>").to_string(),
            named_content(&named, "unk_token", "<unk>").to_string(),
        );
        let (vocab_map, bpe, charsmap) = match json {
            Some(json) => {
                let vocab_map: HashMap<String, u32> = match &json.model.vocab {
                    TokenizerJsonVocab::Map(m) => m.clone(),
                    TokenizerJsonVocab::Scored(l) => l
                        .iter()
                        .enumerate()
                        .map(|(i, (t, _))| (t.clone(), i as u32))
                        .collect(),
                    TokenizerJsonVocab::List(l) => l
                        .iter()
                        .enumerate()
                        .map(|(i, t)| (t.clone(), i as u32))
                        .collect(),
                };
                if json.model.kind.as_deref().is_some_and(|k| k != "BPE") {
                    return Err(Error::Msg(format!(
                        "{}: tokenizer.json holds a {:?} model; NLLB-200's is BPE",
                        dir.display(),
                        json.model.kind.as_deref().unwrap_or_default()
                    )));
                }
                let bpe = HfBpe::from_merges(&vocab_map, &json.merges()?, &unk)?;
                (vocab_map, bpe, json.precompiled_charsmap()?)
            }
            None => {
                let proto = read_proto(&dir.join("sentencepiece.bpe.model"))?;
                // `NllbConverter.convert_from_spm`: the four fairseq specials, then the pieces
                // in order, skipping those already there.
                let spm_pieces: Vec<String> =
                    proto.pieces.iter().map(|p| p.piece.clone()).collect();
                let mut vocab_map: HashMap<String, u32> = HashMap::new();
                for t in [&bos, &pad, &eos, &unk].into_iter().chain(&spm_pieces) {
                    let next = vocab_map.len() as u32;
                    vocab_map.entry(t.clone()).or_insert(next);
                }
                let bpe = HfBpe::from_spm_vocab(&vocab_map, &spm_pieces, &unk)?;
                let charsmap =
                    Some(proto.normalizer_spec.precompiled_charsmap).filter(|c| !c.is_empty());
                (vocab_map, bpe, charsmap)
            }
        };
        let vocab = invert(&vocab_map);
        // Without extra special tokens in the config, transformers keeps the sentencepiece
        // file's control pieces as such (`SentencePieceExtractor`), not the language codes:
        // then only `added_tokens_decoder` can make them known.
        let extra = cfg.extra(false)?.unwrap_or_default();
        let added = build_added(&cfg, &named, &extra, &vocab_map)?;
        let pipe = HfPipeline {
            precompiled: charsmap.as_deref().map(Precompiled::new).transpose()?,
            // Without a charsmap NllbTokenizer sets no normaliser at all.
            collapse_spaces: charsmap.is_some(),
            model: HfModel::Bpe(bpe),
            vocab,
            vocab_map,
            added,
        };
        let id = |t: &str| pipe.token_to_id(t).unwrap_or(3);
        let codes: Vec<String> = NLLB_LANGUAGE_CODES
            .iter()
            .filter(|c| pipe.added.by_content.contains_key(**c))
            .map(|c| c.to_string())
            .collect();
        if codes.is_empty() {
            return Err(Error::Msg(format!(
                "{}: no language codes: tokenizer_config.json has neither \
                 additional_special_tokens / extra_special_tokens nor added_tokens_decoder \
                 listing them (transformers would map every code to <unk>)",
                dir.display()
            )));
        }
        Ok(Self {
            bos_id: id(&bos),
            eos_id: id(&eos),
            pad_id: id(&pad),
            unk_id: id(&unk),
            legacy_behaviour: cfg.bool("legacy_behaviour").unwrap_or(false),
            default_src_lang: cfg.str("src_lang").unwrap_or("eng_Latn").to_string(),
            default_tgt_lang: cfg.str("tgt_lang").map(str::to_string),
            codes,
            pipe,
        })
    }

    /// Whether the config sets `legacy_behaviour` (`pieces </s> [lang]` instead of
    /// `[lang] pieces </s>`).
    pub fn legacy_behaviour(&self) -> bool {
        self.legacy_behaviour
    }

    /// The config's `src_lang` (transformers' default `eng_Latn` when unset).
    pub fn default_src_lang(&self) -> &str {
        &self.default_src_lang
    }

    /// The config's `tgt_lang`, if set.
    pub fn default_tgt_lang(&self) -> Option<&str> {
        self.default_tgt_lang.as_deref()
    }

    fn with_specials(&self, ids: Vec<u32>, lang: &str) -> Result<Vec<u32>> {
        let lang = self.lang_id(lang)?;
        Ok(if self.legacy_behaviour {
            let mut ids = ids;
            ids.extend([self.eos_id, lang]);
            ids
        } else {
            let mut out = Vec::with_capacity(ids.len() + 2);
            out.push(lang);
            out.extend(ids);
            out.push(self.eos_id);
            out
        })
    }
}

impl MultilingualTokenizer for NllbTokenizer {
    fn family(&self) -> MultilingualFamily {
        MultilingualFamily::Nllb
    }
    fn language_codes(&self) -> Vec<String> {
        self.codes.clone()
    }
    fn lang_id(&self, code: &str) -> Result<u32> {
        match self.pipe.token_to_id(code) {
            Some(id) if self.codes.iter().any(|c| c == code) => Ok(id),
            _ => Err(unknown_code_error(self.family(), code, &self.codes)),
        }
    }
    fn tokenize(&self, text: &str) -> Result<Vec<String>> {
        Ok(self
            .pipe
            .encode(text)
            .into_iter()
            .map(|id| self.pipe.id_to_token(id).unwrap_or_default().to_string())
            .collect())
    }
    fn encode(&self, text: &str, src_lang: &str) -> Result<Vec<u32>> {
        self.with_specials(self.pipe.encode(text), src_lang)
    }
    fn encode_target(&self, text: &str, tgt_lang: &str) -> Result<Vec<u32>> {
        self.with_specials(self.pipe.encode(text), tgt_lang)
    }
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        // clean_up_tokenization_spaces is ignored for BPE tokenizers (transformers 5.24).
        Ok(self.pipe.decode(ids, skip_special_tokens))
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        self.pipe.id_to_token(id).map(str::to_string)
    }
    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.pipe.token_to_id(token)
    }
    fn vocab_size(&self) -> usize {
        self.pipe.vocab_map.len()
    }
    fn len(&self) -> usize {
        self.pipe.len()
    }
    fn pad_id(&self) -> u32 {
        self.pad_id
    }
    fn eos_id(&self) -> u32 {
        self.eos_id
    }
    fn unk_id(&self) -> u32 {
        self.unk_id
    }
    fn bos_id(&self) -> u32 {
        self.bos_id
    }
    fn special_ids(&self) -> Vec<u32> {
        self.pipe.special_ids()
    }
}

// ---------------------------------------------------------------------------------------------
// mBART-50

/// `transformers.MBart50Tokenizer` (5.24, built from `sentencepiece.bpe.model`, a unigram
/// model, and the JSON configs), without Python.
///
/// ```
/// use candle_attention::tokenizers::{MBart50Tokenizer, MultilingualTokenizer};
/// # fn main() -> candle::Result<()> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/multilingual_tokenizer/mbart50");
/// let tok = MBart50Tokenizer::from_dir(dir)?; // e.g. "mbart-large-50-many-to-many-mmt"
/// let ids = tok.encode("Hello world!", "en_XX")?;
/// assert_eq!(ids[0], tok.lang_id("en_XX")?);
/// assert_eq!(tok.decode(&ids, true)?, "Hello world!");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MBart50Tokenizer {
    pipe: HfPipeline,
    codes: Vec<String>,
    clean_up: bool,
    bos_id: u32,
    eos_id: u32,
    pad_id: u32,
    unk_id: u32,
}

impl MBart50Tokenizer {
    /// Loads an mBART-50 directory: `sentencepiece.bpe.model`, `tokenizer_config.json` and
    /// `special_tokens_map.json`. When the directory also has a `tokenizer.json`, its
    /// vocabulary (with scores) and charsmap are used instead, as transformers does.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let json = TokenizerJson::read(&dir.join("tokenizer.json"))?;
        if json.is_none() {
            require_files(
                dir,
                MultilingualFamily::MBart50,
                &["sentencepiece.bpe.model"],
            )?;
        }
        let cfg = FamilyConfig::read(dir)?;
        // `AddedToken(mask, lstrip=True, rstrip=False)`: not special, so normalized.
        let mask = AddedTok {
            content: "<mask>".into(),
            special: false,
            lstrip: true,
            normalized: true,
        };
        let named = named_tokens(&cfg, mask)?;
        let cls = named_content(&named, "cls_token", "<s>").to_string();
        let pad = named_content(&named, "pad_token", "<pad>").to_string();
        let eos = named_content(&named, "eos_token", "</s>").to_string();
        let unk = named_content(&named, "unk_token", "<unk>").to_string();
        let mask = named_content(&named, "mask_token", "<mask>").to_string();
        // The four specials, pieces[3:], the codes, <mask> (`MBart50Converter.convert_from_spm`,
        // and `__init__` for a list without language codes).
        let layout = |pieces: &[(String, f64)]| -> Vec<(String, f64)> {
            let mut entries: Vec<(String, f64)> = vec![
                (cls.clone(), 0.0),
                (pad.clone(), 0.0),
                (eos.clone(), 0.0),
                (unk.clone(), 0.0),
            ];
            entries.extend(pieces.iter().skip(3).cloned());
            entries.extend(MBART50_LANGUAGE_CODES.iter().map(|c| (c.to_string(), 0.0)));
            entries.push((mask.clone(), 0.0));
            entries
        };
        let (entries, charsmap) = match json {
            Some(json) => {
                let TokenizerJsonVocab::Scored(list) = &json.model.vocab else {
                    return Err(Error::Msg(format!(
                        "{}: tokenizer.json holds no unigram vocabulary (token, score) list; \
                         mBART-50's model is unigram",
                        dir.display()
                    )));
                };
                let has_codes = list
                    .iter()
                    .any(|(t, _)| MBART50_LANGUAGE_CODES.contains(&t.as_str()));
                let entries = if has_codes {
                    list.clone()
                } else {
                    layout(list)
                };
                (entries, json.precompiled_charsmap()?)
            }
            None => {
                let proto = read_proto(&dir.join("sentencepiece.bpe.model"))?;
                let pieces: Vec<(String, f64)> = proto
                    .pieces
                    .iter()
                    .map(|p| (p.piece.clone(), f64::from(p.score)))
                    .collect();
                let charsmap =
                    Some(proto.normalizer_spec.precompiled_charsmap).filter(|c| !c.is_empty());
                (layout(&pieces), charsmap)
            }
        };
        let unigram = HfUnigram::new(&entries, 3);
        let vocab: Vec<String> = entries.iter().map(|(t, _)| t.clone()).collect();
        let mut vocab_map = HashMap::new();
        for (i, t) in vocab.iter().enumerate() {
            vocab_map.insert(t.clone(), i as u32);
        }
        let special = |c: &str| AddedTok {
            content: c.to_string(),
            special: true,
            lstrip: false,
            normalized: false,
        };
        // The config's extra tokens, then every language code (`extend`).
        let mut extra = cfg.extra(false)?.unwrap_or_default();
        extra.extend(MBART50_LANGUAGE_CODES.iter().map(|c| special(c)));
        let added = build_added(&cfg, &named, &extra, &vocab_map)?;
        let pipe = HfPipeline {
            precompiled: charsmap.as_deref().map(Precompiled::new).transpose()?,
            collapse_spaces: true,
            model: HfModel::Unigram(unigram),
            vocab,
            vocab_map,
            added,
        };
        let id = |t: &str| pipe.token_to_id(t).unwrap_or(3);
        let bos = named_content(&named, "bos_token", "<s>").to_string();
        Ok(Self {
            bos_id: id(&bos),
            eos_id: id(&eos),
            pad_id: id(&pad),
            unk_id: id(&unk),
            clean_up: cfg.bool("clean_up_tokenization_spaces").unwrap_or(false),
            codes: MBART50_LANGUAGE_CODES
                .iter()
                .map(|c| c.to_string())
                .collect(),
            pipe,
        })
    }

    fn with_specials(&self, ids: Vec<u32>, lang: &str) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(ids.len() + 2);
        out.push(self.lang_id(lang)?);
        out.extend(ids);
        out.push(self.eos_id);
        Ok(out)
    }
}

impl MultilingualTokenizer for MBart50Tokenizer {
    fn family(&self) -> MultilingualFamily {
        MultilingualFamily::MBart50
    }
    fn language_codes(&self) -> Vec<String> {
        self.codes.clone()
    }
    fn lang_id(&self, code: &str) -> Result<u32> {
        match self.pipe.token_to_id(code) {
            Some(id) if self.codes.iter().any(|c| c == code) => Ok(id),
            _ => Err(unknown_code_error(self.family(), code, &self.codes)),
        }
    }
    fn tokenize(&self, text: &str) -> Result<Vec<String>> {
        Ok(self
            .pipe
            .encode(text)
            .into_iter()
            .map(|id| self.pipe.id_to_token(id).unwrap_or_default().to_string())
            .collect())
    }
    fn encode(&self, text: &str, src_lang: &str) -> Result<Vec<u32>> {
        self.with_specials(self.pipe.encode(text), src_lang)
    }
    fn encode_target(&self, text: &str, tgt_lang: &str) -> Result<Vec<u32>> {
        self.with_specials(self.pipe.encode(text), tgt_lang)
    }
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let text = self.pipe.decode(ids, skip_special_tokens);
        Ok(if self.clean_up {
            clean_up_tokenization(&text)
        } else {
            text
        })
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        self.pipe.id_to_token(id).map(str::to_string)
    }
    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.pipe.token_to_id(token)
    }
    fn vocab_size(&self) -> usize {
        self.pipe.len()
    }
    fn len(&self) -> usize {
        self.pipe.len()
    }
    fn pad_id(&self) -> u32 {
        self.pad_id
    }
    fn eos_id(&self) -> u32 {
        self.eos_id
    }
    fn unk_id(&self) -> u32 {
        self.unk_id
    }
    fn bos_id(&self) -> u32 {
        self.bos_id
    }
    fn special_ids(&self) -> Vec<u32> {
        self.pipe.special_ids()
    }
}

// ---------------------------------------------------------------------------------------------
// M2M100

/// `transformers.M2M100Tokenizer` (5.24: the Python tokenizer on the `sentencepiece` library),
/// without Python.
#[derive(Debug, Clone)]
pub struct M2M100Tokenizer {
    spm: SentencePieceModel,
    encoder: Vocab,
    decoder: HashMap<u32, String>,
    /// Language code (`en`) to token (`__en__`) and id (after `vocab.json`).
    codes: Vec<String>,
    lang_token_to_id: HashMap<String, u32>,
    id_to_lang_token: HashMap<u32, String>,
    added_encoder: HashMap<String, u32>,
    added_decoder: HashMap<u32, String>,
    split_trie: AddedTokenTrie,
    all_special_tokens: HashSet<String>,
    all_special_ids: HashSet<u32>,
    unk_token: String,
    clean_up: bool,
    bos_id: u32,
    eos_id: u32,
    pad_id: u32,
    unk_id: u32,
}

impl M2M100Tokenizer {
    /// Loads an M2M100 directory: `vocab.json` and `sentencepiece.bpe.model` (required),
    /// `tokenizer_config.json` and `special_tokens_map.json`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        require_files(
            dir,
            MultilingualFamily::M2M100,
            &["vocab.json", "sentencepiece.bpe.model"],
        )?;
        let cfg = FamilyConfig::read(dir)?;
        let spm = SentencePieceModel::from_file(dir.join("sentencepiece.bpe.model"))?;
        let encoder = Vocab::from_file(&dir.join("vocab.json"))?;
        let decoder = encoder.inverse();
        let codes: Vec<String> = match cfg.str("language_codes").unwrap_or("m2m100") {
            "m2m100" => M2M100_LANGUAGE_CODES
                .iter()
                .map(|c| c.to_string())
                .collect(),
            "wmt21" => M2M100_WMT21_LANGUAGE_CODES
                .iter()
                .map(|c| c.to_string())
                .collect(),
            other => {
                return Err(Error::Msg(format!(
                    "{}: language_codes {other:?} is neither \"m2m100\" nor \"wmt21\"",
                    cfg.path.display()
                )))
            }
        };
        let size = encoder.len() as u32;
        let lang_token_to_id: HashMap<String, u32> = codes
            .iter()
            .enumerate()
            .map(|(i, c)| (format!("__{c}__"), size + i as u32))
            .collect();
        let id_to_lang_token = lang_token_to_id
            .iter()
            .map(|(t, &id)| (id, t.clone()))
            .collect();
        let plain = AddedTok {
            content: String::new(),
            special: true,
            lstrip: false,
            normalized: false,
        };
        let mut specials: Vec<String> = Vec::new();
        for name in [
            "bos_token",
            "eos_token",
            "unk_token",
            "sep_token",
            "pad_token",
        ] {
            if let Some(t) = cfg.named(
                name,
                &AddedTok {
                    content: match name {
                        "bos_token" => "<s>",
                        "unk_token" => "<unk>",
                        "pad_token" => "<pad>",
                        _ => "</s>",
                    }
                    .into(),
                    ..plain.clone()
                },
            )? {
                specials.push(t.content);
            }
        }
        let named_of = |name: &str, d: &str| -> Result<String> {
            Ok(cfg
                .named(
                    name,
                    &AddedTok {
                        content: d.into(),
                        ..plain.clone()
                    },
                )?
                .map_or(d.to_string(), |t| t.content))
        };
        let unk_token = named_of("unk_token", "<unk>")?;
        let unk_vocab_id = *encoder.map.get(&unk_token).ok_or_else(|| {
            Error::Msg(format!(
                "{}: vocab.json has no unknown token {unk_token:?}",
                dir.display()
            ))
        })?;
        for t in cfg.extra(true)?.unwrap_or_default() {
            specials.push(t.content);
        }
        let convert = |t: &str| -> u32 {
            lang_token_to_id
                .get(t)
                .or_else(|| encoder.map.get(t))
                .copied()
                .unwrap_or(unk_vocab_id)
        };
        let mut added_encoder = HashMap::new();
        let mut added_decoder = HashMap::new();
        for (id, t) in cfg.decoder()? {
            added_encoder.insert(t.content.clone(), id);
            added_decoder.insert(id, t.content);
        }
        let mut next = (size as usize + added_encoder.len()) as u32;
        for t in &specials {
            if added_encoder.contains_key(t) {
                continue;
            }
            let id = match lang_token_to_id.get(t).or_else(|| encoder.map.get(t)) {
                Some(&id) => id,
                None => {
                    next += 1;
                    next - 1
                }
            };
            added_encoder.insert(t.clone(), id);
            added_decoder.insert(id, t.clone());
        }
        let mut split: Vec<&str> = added_encoder.keys().map(String::as_str).collect();
        split.sort_unstable();
        let split_trie = AddedTokenTrie::new(split);
        let all_special_ids = specials
            .iter()
            .map(|t| added_encoder.get(t).copied().unwrap_or_else(|| convert(t)))
            .collect();
        Ok(Self {
            bos_id: convert(&named_of("bos_token", "<s>")?),
            eos_id: convert(&named_of("eos_token", "</s>")?),
            pad_id: convert(&named_of("pad_token", "<pad>")?),
            unk_id: unk_vocab_id,
            clean_up: cfg.bool("clean_up_tokenization_spaces").unwrap_or(false),
            all_special_tokens: specials.into_iter().collect(),
            all_special_ids,
            spm,
            encoder,
            decoder,
            codes,
            lang_token_to_id,
            id_to_lang_token,
            added_encoder,
            added_decoder,
            split_trie,
            unk_token,
        })
    }

    /// The sentencepiece model (`sentencepiece.bpe.model`).
    pub fn spm(&self) -> &SentencePieceModel {
        &self.spm
    }

    fn convert(&self, token: &str) -> u32 {
        self.added_encoder
            .get(token)
            .or_else(|| self.lang_token_to_id.get(token))
            .or_else(|| self.encoder.map.get(token))
            .copied()
            .unwrap_or(self.unk_id)
    }

    fn with_specials(&self, text: &str, lang: &str) -> Result<Vec<u32>> {
        let lang = self.lang_id(lang)?;
        let mut out = vec![lang];
        out.extend(self.tokenize(text)?.iter().map(|t| self.convert(t)));
        out.push(self.eos_id);
        Ok(out)
    }
}

impl MultilingualTokenizer for M2M100Tokenizer {
    fn family(&self) -> MultilingualFamily {
        MultilingualFamily::M2M100
    }
    fn language_codes(&self) -> Vec<String> {
        self.codes.clone()
    }
    /// `get_lang_id(code)`: the id of `__code__`.
    fn lang_id(&self, code: &str) -> Result<u32> {
        self.lang_token_to_id
            .get(&format!("__{code}__"))
            .copied()
            .ok_or_else(|| unknown_code_error(self.family(), code, &self.codes))
    }
    fn tokenize(&self, text: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for segment in self.split_trie.split(text) {
            if self.added_encoder.contains_key(segment) || self.all_special_tokens.contains(segment)
            {
                out.push(segment.to_string());
            } else {
                out.extend(self.spm.encode_pieces(segment)?);
            }
        }
        Ok(out)
    }
    fn encode(&self, text: &str, src_lang: &str) -> Result<Vec<u32>> {
        self.with_specials(text, src_lang)
    }
    fn encode_target(&self, text: &str, tgt_lang: &str) -> Result<Vec<u32>> {
        self.with_specials(text, tgt_lang)
    }
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let mut out = String::new();
        let mut run: Vec<String> = Vec::new();
        for &id in ids {
            if skip_special_tokens && self.all_special_ids.contains(&id) {
                continue;
            }
            let t = self
                .id_to_token(id)
                .unwrap_or_else(|| self.unk_token.clone());
            if self.all_special_tokens.contains(&t) {
                out.push_str(&self.spm.decode_pieces(&run));
                out.push_str(&t);
                run.clear();
            } else {
                run.push(t);
            }
        }
        out.push_str(&self.spm.decode_pieces(&run));
        let out = py_strip(&out).to_string();
        Ok(if self.clean_up {
            clean_up_tokenization(&out)
        } else {
            out
        })
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        Some(
            self.added_decoder
                .get(&id)
                .or_else(|| self.id_to_lang_token.get(&id))
                .or_else(|| self.decoder.get(&id))
                .cloned()
                .unwrap_or_else(|| self.unk_token.clone()),
        )
    }
    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.added_encoder
            .get(token)
            .or_else(|| self.lang_token_to_id.get(token))
            .or_else(|| self.encoder.map.get(token))
            .copied()
    }
    fn vocab_size(&self) -> usize {
        self.encoder.len()
    }
    fn len(&self) -> usize {
        let mut ids: HashSet<u32> = self.encoder.map.values().copied().collect();
        ids.extend(self.added_encoder.values());
        ids.len()
    }
    fn pad_id(&self) -> u32 {
        self.pad_id
    }
    fn eos_id(&self) -> u32 {
        self.eos_id
    }
    fn unk_id(&self) -> u32 {
        self.unk_id
    }
    fn bos_id(&self) -> u32 {
        self.bos_id
    }
    fn special_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.all_special_ids.iter().copied().collect();
        ids.sort_unstable();
        ids
    }
}
