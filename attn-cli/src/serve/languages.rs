//! Languages as LibreTranslate's API names them: ISO 639-1 (`en`), with its own codes for
//! Chinese scripts (`zh-Hans`, `zh-Hant`); mapped from and to each model's codes (`eng_Latn`,
//! `en_XX`, `en`, a MarianMT directory's `source_lang` / `target_lang`).

use candle_attention::Language;

/// The API code of a model's language, where it has one: its ISO 639-1 code, Chinese by
/// script (`zho_Hant` and `zh_TW` are `zh-Hant`, other Chinese is `zh-Hans`), Portuguese of
/// Brazil (`pt_BR`, `por_Latn` stays `pt`) as `pt-BR`.
pub fn api_code(language: &Language) -> Option<String> {
    let iso = language.iso639_1.as_deref()?;
    let code = language
        .code
        .trim_start_matches(">>")
        .trim_end_matches("<<");
    Some(match iso {
        "zh" if code.contains("Hant") || code.ends_with("_TW") || code.ends_with("_HK") => {
            "zh-Hant".to_string()
        }
        "zh" => "zh-Hans".to_string(),
        "pt" if code.ends_with("_BR") || code.ends_with("-BR") => "pt-BR".to_string(),
        other => other.to_string(),
    })
}

/// The English name of an API code's language (`zh-Hans` is "Chinese (Simplified)").
pub fn api_name(code: &str, language: &Language) -> String {
    match code {
        "zh-Hans" => "Chinese (Simplified)".to_string(),
        "zh-Hant" => "Chinese (Traditional)".to_string(),
        "pt-BR" => "Portuguese (Brazil)".to_string(),
        _ => language.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_codes_become_libretranslate_codes() {
        for (code, api) in [
            ("eng_Latn", Some("en")),
            ("zho_Hans", Some("zh-Hans")),
            ("zho_Hant", Some("zh-Hant")),
            ("zh_CN", Some("zh-Hans")),
            ("zh", Some("zh-Hans")),
            ("pt_XX", Some("pt")),
            ("por_Latn", Some("pt")),
            ("de_DE", Some("de")),
            (">>fra<<", Some("fr")),
            ("ars_Arab", None),
        ] {
            assert_eq!(
                api_code(&Language::from_code(code)).as_deref(),
                api,
                "{code}"
            );
        }
        let zh = Language::from_code("zho_Hant");
        assert_eq!(api_name("zh-Hant", &zh), "Chinese (Traditional)");
        assert_eq!(api_name("de", &Language::from_code("deu_Latn")), "German");
    }
}
