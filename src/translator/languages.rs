//! Languages as people name them: the ISO 639-1 code and English name of each family's codes
//! (`eng_Latn`, `en_XX`, `en`, a MarianMT directory's `en` or `>>fra<<`), so a caller can ask
//! for `en` → `de` whatever the family.

/// One language a translator reads or writes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Language {
    /// The code as the family spells it: `eng_Latn` (NLLB-200), `en` (M2M100), `en_XX`
    /// (mBART-50), `en` or `>>fra<<` (MarianMT).
    pub code: String,
    /// Its ISO 639-1 code (`en`), where the language has one.
    pub iso639_1: Option<String>,
    /// Its English name (`English`), or the code when it has no ISO 639-1 code.
    pub name: String,
}

impl Language {
    /// The language of a family code, with its ISO 639-1 code and name looked up.
    pub fn from_code(code: &str) -> Self {
        let iso = iso639_1_of(code);
        let name = iso
            .and_then(|iso| ISO_639.iter().find(|l| l.0 == iso))
            .map_or_else(|| code.to_string(), |l| l.1.to_string());
        Self {
            code: code.to_string(),
            iso639_1: iso.map(str::to_string),
            name,
        }
    }

    /// Whether `query` names this language: its code exactly, or its ISO 639-1 code (any case).
    pub fn is_named(&self, query: &str) -> bool {
        self.code == query
            || self
                .iso639_1
                .as_deref()
                .is_some_and(|iso| iso.eq_ignore_ascii_case(query))
    }
}

/// ISO 639-1 code, English name, and the ISO 639-3 codes (the individual language first, then
/// the macrolanguage) that the families' codes use for it.
const ISO_639: &[(&str, &str, &[&str])] = &[
    ("af", "Afrikaans", &["afr"]),
    ("ak", "Akan", &["aka", "twi"]),
    ("am", "Amharic", &["amh"]),
    ("ar", "Arabic", &["arb", "ara"]),
    ("as", "Assamese", &["asm"]),
    ("ay", "Aymara", &["ayr", "aym"]),
    ("az", "Azerbaijani", &["azj", "aze"]),
    ("ba", "Bashkir", &["bak"]),
    ("be", "Belarusian", &["bel"]),
    ("bg", "Bulgarian", &["bul"]),
    ("bm", "Bambara", &["bam"]),
    ("bn", "Bengali", &["ben"]),
    ("bo", "Tibetan", &["bod"]),
    ("br", "Breton", &["bre"]),
    ("bs", "Bosnian", &["bos"]),
    ("ca", "Catalan", &["cat"]),
    ("cs", "Czech", &["ces"]),
    ("cy", "Welsh", &["cym"]),
    ("da", "Danish", &["dan"]),
    ("de", "German", &["deu"]),
    ("dz", "Dzongkha", &["dzo"]),
    ("ee", "Ewe", &["ewe"]),
    ("el", "Greek", &["ell"]),
    ("en", "English", &["eng"]),
    ("eo", "Esperanto", &["epo"]),
    ("es", "Spanish", &["spa"]),
    ("et", "Estonian", &["est", "ekk"]),
    ("eu", "Basque", &["eus"]),
    ("fa", "Persian", &["pes", "fas"]),
    ("ff", "Fulah", &["fuv", "ful"]),
    ("fi", "Finnish", &["fin"]),
    ("fj", "Fijian", &["fij"]),
    ("fo", "Faroese", &["fao"]),
    ("fr", "French", &["fra"]),
    ("fy", "Western Frisian", &["fry"]),
    ("ga", "Irish", &["gle"]),
    ("gd", "Scottish Gaelic", &["gla"]),
    ("gl", "Galician", &["glg"]),
    ("gn", "Guarani", &["grn"]),
    ("gu", "Gujarati", &["guj"]),
    ("ha", "Hausa", &["hau"]),
    ("he", "Hebrew", &["heb"]),
    ("hi", "Hindi", &["hin"]),
    ("hr", "Croatian", &["hrv"]),
    ("ht", "Haitian Creole", &["hat"]),
    ("hu", "Hungarian", &["hun"]),
    ("hy", "Armenian", &["hye"]),
    ("id", "Indonesian", &["ind"]),
    ("ig", "Igbo", &["ibo"]),
    ("is", "Icelandic", &["isl"]),
    ("it", "Italian", &["ita"]),
    ("ja", "Japanese", &["jpn"]),
    ("jv", "Javanese", &["jav"]),
    ("ka", "Georgian", &["kat"]),
    ("kg", "Kongo", &["kon"]),
    ("ki", "Kikuyu", &["kik"]),
    ("kk", "Kazakh", &["kaz"]),
    ("km", "Khmer", &["khm"]),
    ("kn", "Kannada", &["kan"]),
    ("ko", "Korean", &["kor"]),
    ("kr", "Kanuri", &["knc", "kau"]),
    ("ks", "Kashmiri", &["kas"]),
    ("ku", "Kurdish", &["kmr", "kur"]),
    ("ky", "Kyrgyz", &["kir"]),
    ("lb", "Luxembourgish", &["ltz"]),
    ("lg", "Ganda", &["lug"]),
    ("li", "Limburgish", &["lim"]),
    ("ln", "Lingala", &["lin"]),
    ("lo", "Lao", &["lao"]),
    ("lt", "Lithuanian", &["lit"]),
    ("lv", "Latvian", &["lvs", "lav"]),
    ("mg", "Malagasy", &["plt", "mlg"]),
    ("mi", "Maori", &["mri"]),
    ("mk", "Macedonian", &["mkd"]),
    ("ml", "Malayalam", &["mal"]),
    ("mn", "Mongolian", &["khk", "mon"]),
    ("mr", "Marathi", &["mar"]),
    ("ms", "Malay", &["zsm", "msa"]),
    ("mt", "Maltese", &["mlt"]),
    ("my", "Burmese", &["mya"]),
    ("nb", "Norwegian Bokmål", &["nob"]),
    ("ne", "Nepali", &["npi", "nep"]),
    ("nl", "Dutch", &["nld"]),
    ("nn", "Norwegian Nynorsk", &["nno"]),
    ("ny", "Chichewa", &["nya"]),
    ("oc", "Occitan", &["oci"]),
    ("om", "Oromo", &["gaz", "orm"]),
    ("or", "Odia", &["ory", "ori"]),
    ("pa", "Punjabi", &["pan"]),
    ("pl", "Polish", &["pol"]),
    ("ps", "Pashto", &["pbt", "pus"]),
    ("pt", "Portuguese", &["por"]),
    ("qu", "Quechua", &["quy", "que"]),
    ("rn", "Rundi", &["run"]),
    ("ro", "Romanian", &["ron"]),
    ("ru", "Russian", &["rus"]),
    ("rw", "Kinyarwanda", &["kin"]),
    ("sa", "Sanskrit", &["san"]),
    ("sc", "Sardinian", &["srd"]),
    ("sd", "Sindhi", &["snd"]),
    ("sg", "Sango", &["sag"]),
    ("si", "Sinhala", &["sin"]),
    ("sk", "Slovak", &["slk"]),
    ("sl", "Slovenian", &["slv"]),
    ("sm", "Samoan", &["smo"]),
    ("sn", "Shona", &["sna"]),
    ("so", "Somali", &["som"]),
    ("sq", "Albanian", &["als", "sqi"]),
    ("sr", "Serbian", &["srp"]),
    ("ss", "Swati", &["ssw"]),
    ("st", "Southern Sotho", &["sot"]),
    ("su", "Sundanese", &["sun"]),
    ("sv", "Swedish", &["swe"]),
    ("sw", "Swahili", &["swh", "swa"]),
    ("ta", "Tamil", &["tam"]),
    ("te", "Telugu", &["tel"]),
    ("tg", "Tajik", &["tgk"]),
    ("th", "Thai", &["tha"]),
    ("ti", "Tigrinya", &["tir"]),
    ("tk", "Turkmen", &["tuk"]),
    ("tl", "Tagalog", &["tgl", "fil"]),
    ("tn", "Tswana", &["tsn"]),
    ("tr", "Turkish", &["tur"]),
    ("ts", "Tsonga", &["tso"]),
    ("tt", "Tatar", &["tat"]),
    ("ug", "Uyghur", &["uig"]),
    ("uk", "Ukrainian", &["ukr"]),
    ("ur", "Urdu", &["urd"]),
    ("uz", "Uzbek", &["uzn", "uzb"]),
    ("vi", "Vietnamese", &["vie"]),
    ("wo", "Wolof", &["wol"]),
    ("xh", "Xhosa", &["xho"]),
    ("yi", "Yiddish", &["ydd", "yid"]),
    ("yo", "Yoruba", &["yor"]),
    ("zh", "Chinese", &["zho", "cmn"]),
    ("zu", "Zulu", &["zul"]),
];

/// The ISO 639-1 code of a family's language code, where it has one:
/// * NLLB-200 `xxx_Scrp` and MarianMT `>>xxx<<` / `>>xxx_Scrp<<`: by the ISO 639-3 part;
/// * mBART-50 `xx_YY`: its first part;
/// * two letters (M2M100, MarianMT's `source_lang`): itself, when it is an ISO 639-1 code;
/// * three letters: by ISO 639-3.
pub(crate) fn iso639_1_of(code: &str) -> Option<&'static str> {
    let bare = code
        .strip_prefix(">>")
        .and_then(|c| c.strip_suffix("<<"))
        .unwrap_or(code);
    let language = bare
        .split(['_', '-'])
        .next()
        .unwrap_or(bare)
        .to_ascii_lowercase();
    match language.len() {
        2 => ISO_639.iter().find(|l| l.0 == language).map(|l| l.0),
        3 => ISO_639
            .iter()
            .find(|l| l.2.contains(&language.as_str()))
            .map(|l| l.0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_spelling_maps_to_iso_639_1() {
        for (code, iso) in [
            ("eng_Latn", Some("en")),
            ("deu_Latn", Some("de")),
            ("zho_Hans", Some("zh")),
            ("arb_Arab", Some("ar")),
            ("ars_Arab", None),
            ("pes_Arab", Some("fa")),
            ("en_XX", Some("en")),
            ("zh_CN", Some("zh")),
            ("en", Some("en")),
            ("ast", None),
            ("ns", None),
            (">>fra<<", Some("fr")),
            (">>por_Latn<<", Some("pt")),
            ("", None),
        ] {
            assert_eq!(iso639_1_of(code), iso, "{code}");
        }
    }

    #[test]
    fn a_language_is_named_by_its_code_or_its_iso_code() {
        let nllb = Language::from_code("deu_Latn");
        assert_eq!(nllb.name, "German");
        assert!(nllb.is_named("deu_Latn") && nllb.is_named("de") && nllb.is_named("DE"));
        assert!(!nllb.is_named("deu") && !nllb.is_named("en"));
        let other = Language::from_code("ars_Arab");
        assert_eq!((other.iso639_1, other.name.as_str()), (None, "ars_Arab"));
    }

    #[test]
    fn the_table_has_no_twins() {
        let mut seen = std::collections::HashSet::new();
        for (iso, _, codes) in ISO_639 {
            assert!(seen.insert(*iso), "{iso} twice");
            for c in *codes {
                assert!(seen.insert(*c), "{c} twice");
            }
        }
    }
}
