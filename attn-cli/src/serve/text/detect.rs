//! Language identification for `source: "auto"` and `/detect`, with `whatlang`: trigram
//! profiles of 70 languages plus script detection, in ~0.8 MB of source that builds in ~3 s. The
//! alternative, `lingua`, is more accurate on short texts but ships its models as one crate per
//! language, 2.5–3.5 MB each (four languages: 11 MB of crates, a 22 MB binary, 64 s to build
//! on 2 cores), and the server may have any of ~200 languages (NLLB).
//!
//! LibreTranslate (1.9.x, `detect.py`) answers with langdetect (lexilang under 20 characters)
//! restricted to its installed languages: up to 3 `{language, confidence}`, confidence
//! `round(p * 100)`; when nothing is found, `[{"language": "en", "confidence": 0}]`. Here the
//! same: up to three candidates, the best first, with the probability mass whatlang leaves to
//! each (the best's confidence, then the next best's among the rest, and so on), as whole
//! percentages. A text without a letter gives an empty list: the HTTP layer then answers as
//! LibreTranslate does (`en` with confidence 0, or the error for an empty `q`).
//!
//! Chinese: whatlang says Mandarin for any Han text; Traditional (`zh-Hant`) or Simplified
//! (`zh-Hans`) is decided by counting characters that exist in one script only. Portuguese is
//! `pt` or `pt-BR`, whichever the server has (`pt` if both), Norwegian `nb` or `no`.

use whatlang::{Detector, Lang};

/// Up to 3 (API language code, confidence 0..=100) for `text`, best first, among `candidates`
/// (LibreTranslate codes such as "en", "de", "zh-Hans", "pt-BR"); empty when the text has no
/// letters. When the text has letters but none of the candidates whatlang knows fits it (or
/// whatlang knows none of them), the answer is LibreTranslate's: `en` (or the first candidate
/// when `en` is not one) with confidence 0.
pub fn detect(text: &str, candidates: &[String]) -> Vec<(String, f64)> {
    if candidates.is_empty() || !text.chars().any(char::is_alphabetic) {
        return Vec::new();
    }
    let mut allow: Vec<Lang> = Vec::new();
    for code in candidates {
        if let Some(lang) = whatlang_of(code) {
            if !allow.contains(&lang) {
                allow.push(lang);
            }
        }
    }
    let mut out: Vec<(String, f64)> = Vec::new();
    let mut left = 1.0;
    while out.len() < 3 && !allow.is_empty() {
        let Some(info) = Detector::with_allowlist(allow.clone()).detect(text) else {
            break;
        };
        let lang = info.lang();
        if !allow.contains(&lang) {
            // whatlang names the only language of some scripts whatever the allowlist says.
            break;
        }
        allow.retain(|&l| l != lang);
        let Some(code) = api_code(lang, text, candidates) else {
            continue;
        };
        let confidence = left * info.confidence().clamp(0.0, 1.0);
        left -= confidence;
        if !out.is_empty() && confidence < 0.005 {
            break;
        }
        out.push((code, (confidence * 100.0).round()));
    }
    if out.is_empty() {
        let fallback = candidates
            .iter()
            .find(|c| *c == "en")
            .unwrap_or(&candidates[0]);
        out.push((fallback.clone(), 0.0));
    }
    out
}

/// ISO 639-1 (as LibreTranslate writes it) of each language whatlang knows.
const CODES: &[(&str, Lang)] = &[
    ("af", Lang::Afr),
    ("ak", Lang::Aka),
    ("am", Lang::Amh),
    ("ar", Lang::Ara),
    ("az", Lang::Aze),
    ("be", Lang::Bel),
    ("bg", Lang::Bul),
    ("bn", Lang::Ben),
    ("ca", Lang::Cat),
    ("cs", Lang::Ces),
    ("cy", Lang::Cym),
    ("da", Lang::Dan),
    ("de", Lang::Deu),
    ("el", Lang::Ell),
    ("en", Lang::Eng),
    ("eo", Lang::Epo),
    ("es", Lang::Spa),
    ("et", Lang::Est),
    ("fa", Lang::Pes),
    ("fi", Lang::Fin),
    ("fr", Lang::Fra),
    ("gu", Lang::Guj),
    ("he", Lang::Heb),
    ("hi", Lang::Hin),
    ("hr", Lang::Hrv),
    ("hu", Lang::Hun),
    ("hy", Lang::Hye),
    ("id", Lang::Ind),
    ("it", Lang::Ita),
    ("ja", Lang::Jpn),
    ("jv", Lang::Jav),
    ("ka", Lang::Kat),
    ("km", Lang::Khm),
    ("kn", Lang::Kan),
    ("ko", Lang::Kor),
    ("la", Lang::Lat),
    ("lt", Lang::Lit),
    ("lv", Lang::Lav),
    ("mk", Lang::Mkd),
    ("ml", Lang::Mal),
    ("mr", Lang::Mar),
    ("my", Lang::Mya),
    ("nb", Lang::Nob),
    ("ne", Lang::Nep),
    ("nl", Lang::Nld),
    ("or", Lang::Ori),
    ("pa", Lang::Pan),
    ("pl", Lang::Pol),
    ("pt", Lang::Por),
    ("ro", Lang::Ron),
    ("ru", Lang::Rus),
    ("si", Lang::Sin),
    ("sk", Lang::Slk),
    ("sl", Lang::Slv),
    ("sn", Lang::Sna),
    ("sr", Lang::Srp),
    ("sv", Lang::Swe),
    ("ta", Lang::Tam),
    ("te", Lang::Tel),
    ("th", Lang::Tha),
    ("tk", Lang::Tuk),
    ("tl", Lang::Tgl),
    ("tr", Lang::Tur),
    ("uk", Lang::Ukr),
    ("ur", Lang::Urd),
    ("uz", Lang::Uzb),
    ("vi", Lang::Vie),
    ("yi", Lang::Yid),
    ("zh", Lang::Cmn),
    ("zu", Lang::Zul),
];

/// The whatlang language of an API code (`pt-BR` → Portuguese, `zh-Hant` → Mandarin), if any.
fn whatlang_of(code: &str) -> Option<Lang> {
    let base = code.split(['-', '_']).next()?.to_ascii_lowercase();
    let base = match base.as_str() {
        "no" | "nn" => "nb",
        "iw" => "he",
        "fil" => "tl",
        "in" => "id",
        "pb" | "zt" => return whatlang_of(if base == "pb" { "pt" } else { "zh" }),
        b => b,
    };
    CODES.iter().find(|(c, _)| *c == base).map(|&(_, l)| l)
}

/// The candidate that names `lang`, choosing among variants (zh-Hans/zh-Hant by script,
/// pt over pt-BR, …).
fn api_code(lang: Lang, text: &str, candidates: &[String]) -> Option<String> {
    let named: Vec<&String> = candidates
        .iter()
        .filter(|c| whatlang_of(c) == Some(lang))
        .collect();
    let pick = |prefer: &[&str]| -> Option<String> {
        prefer
            .iter()
            .find_map(|p| named.iter().find(|c| c.eq_ignore_ascii_case(p)))
            .or(named.first())
            .map(|c| c.to_string())
    };
    match lang {
        Lang::Cmn if traditional(text) => pick(&["zh-Hant", "zt", "zh-TW", "zh-Hans", "zh"]),
        Lang::Cmn => pick(&["zh-Hans", "zh", "zh-CN", "zh-Hant"]),
        Lang::Por => pick(&["pt", "pt-PT", "pt-BR", "pb"]),
        _ => pick(&[]),
    }
}

/// Frequent characters that differ between the scripts: pairs of simplified, traditional.
const SIMPLIFIED: &str = "这个们来时为会学对发经过还没长开关东车门问见语书话电国说间实现进动种样让认点从应该头听买卖写读爱马鸟鱼龙边远运连选钱银铁错际陆阳阴难题风飞饭馆体办务医单历变号吗员团园图场声处备复够妈宝岁岛师带帮广库张强归当录忆态总恶惊战护报择换据击数断无旧显机杂权条极构标树桥梦检楼欢气汉汤测济满灯灵热爷独环画疗盐监盘码确礼离积称稳笔简紧红约级纪纸线练组细织终结给络绝统继续维绿编网罗职联胜脑脚艺节苏药获营虽装观规视觉计订讨训议记讲许论设访证评识诉词译试诗请课谁调谈谢贝负财责败货质费资赛赞轻较输达迟适邮钟键镜闭闻阅队险随页顶项顺须顾预领频颜饮鸡齐龄亚儿万与丰临举么义乐习乡乱争亲众优传伤价";
const TRADITIONAL: &str = "這個們來時為會學對發經過還沒長開關東車門問見語書話電國說間實現進動種樣讓認點從應該頭聽買賣寫讀愛馬鳥魚龍邊遠運連選錢銀鐵錯際陸陽陰難題風飛飯館體辦務醫單歷變號嗎員團園圖場聲處備復夠媽寶歲島師帶幫廣庫張強歸當錄憶態總惡驚戰護報擇換據擊數斷無舊顯機雜權條極構標樹橋夢檢樓歡氣漢湯測濟滿燈靈熱爺獨環畫療鹽監盤碼確禮離積稱穩筆簡緊紅約級紀紙線練組細織終結給絡絕統繼續維綠編網羅職聯勝腦腳藝節蘇藥獲營雖裝觀規視覺計訂討訓議記講許論設訪證評識訴詞譯試詩請課誰調談謝貝負財責敗貨質費資賽贊輕較輸達遲適郵鐘鍵鏡閉聞閱隊險隨頁頂項順須顧預領頻顏飲雞齊齡亞兒萬與豐臨舉麼義樂習鄉亂爭親眾優傳傷價";

/// Whether a Han text has more Traditional-only than Simplified-only characters.
fn traditional(text: &str) -> bool {
    let (mut simplified, mut traditional) = (0, 0);
    for c in text.chars() {
        if SIMPLIFIED.contains(c) {
            simplified += 1;
        } else if TRADITIONAL.contains(c) {
            traditional += 1;
        }
    }
    traditional > simplified
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn best(text: &str, candidates: &[&str]) -> String {
        detect(text, &codes(candidates))
            .first()
            .map(|(c, _)| c.clone())
            .unwrap_or_default()
    }

    const ALL: &[&str] = &[
        "en", "de", "fr", "es", "it", "pt", "pt-BR", "nl", "ru", "uk", "pl", "cs", "sv", "da",
        "nb", "fi", "tr", "ar", "fa", "he", "hi", "bn", "ja", "ko", "zh-Hans", "zh-Hant", "vi",
        "id", "th", "el", "ro", "hu", "ca", "eo", "ga", "ms",
    ];

    #[test]
    fn the_pair_has_both_scripts_in_the_table() {
        assert_eq!(SIMPLIFIED.chars().count(), TRADITIONAL.chars().count());
        for (s, t) in SIMPLIFIED.chars().zip(TRADITIONAL.chars()) {
            assert_ne!(s, t);
            assert!(!TRADITIONAL.contains(s), "{s} is in both");
            assert!(!SIMPLIFIED.contains(t), "{t} is in both");
        }
        for (code, lang) in CODES {
            assert_eq!(whatlang_of(code), Some(*lang));
        }
        assert_eq!(CODES.len(), Lang::all().len());
    }

    #[test]
    fn detects_sentences_of_many_languages() {
        let cases = [
            (
                "en",
                "The weather is lovely today and we are going to the park.",
            ),
            (
                "de",
                "Das Wetter ist heute schön und wir gehen in den Park.",
            ),
            ("fr", "Il fait beau aujourd'hui et nous allons au parc."),
            (
                "es",
                "Hace buen tiempo hoy y vamos al parque con los niños.",
            ),
            (
                "it",
                "Oggi il tempo è bello e andiamo al parco con i bambini.",
            ),
            (
                "pt",
                "O tempo está bom hoje e nós vamos ao parque com as crianças.",
            ),
            ("nl", "Het weer is vandaag mooi en we gaan naar het park."),
            ("ru", "Сегодня хорошая погода, и мы идём в парк."),
            ("uk", "Сьогодні гарна погода, і ми йдемо до парку з дітьми."),
            (
                "pl",
                "Dzisiaj jest ładna pogoda i idziemy do parku z dziećmi.",
            ),
            ("ar", "الطقس جميل اليوم ونحن ذاهبون إلى الحديقة."),
            ("he", "מזג האוויר יפה היום ואנחנו הולכים לפארק."),
            ("hi", "आज मौसम अच्छा है और हम पार्क जा रहे हैं।"),
            ("ja", "今日は天気がいいので、公園に行きます。"),
            ("ko", "오늘은 날씨가 좋아서 공원에 갑니다."),
            (
                "zh-Hans",
                "今天天气很好，我们要去公园。这个国家的人们说汉语。",
            ),
            (
                "zh-Hant",
                "今天天氣很好，我們要去公園。這個國家的人們說漢語。",
            ),
            ("el", "Ο καιρός είναι ωραίος σήμερα και πάμε στο πάρκο."),
            ("tr", "Bugün hava çok güzel ve parka gidiyoruz."),
            ("sv", "Vädret är fint idag och vi går till parken."),
        ];
        for (want, text) in cases {
            assert_eq!(best(text, ALL), want, "{text}");
        }
    }

    #[test]
    fn answers_only_among_candidates_with_confidences_that_add_up() {
        let text = "Das Wetter ist heute schön und wir gehen in den Park.";
        let got = detect(text, &codes(&["en", "de", "nl"]));
        assert_eq!(got[0].0, "de");
        assert!(got.len() <= 3);
        let total: f64 = got.iter().map(|(_, c)| c).sum();
        assert!((0.0..=100.5).contains(&total), "{got:?}");
        for pair in got.windows(2) {
            assert!(pair[0].1 >= pair[1].1, "{got:?}");
        }
        for (code, c) in &got {
            assert!(["en", "de", "nl"].contains(&code.as_str()));
            assert!((0.0..=100.0).contains(c) && c.fract() == 0.0);
        }
        // German text, but the server has only English and French.
        assert!(["en", "fr"].contains(&best(text, &["en", "fr"]).as_str()));
    }

    #[test]
    fn variants_follow_the_candidates() {
        let pt = "O tempo está bom hoje e nós vamos ao parque com as crianças.";
        assert_eq!(best(pt, &["en", "pt-BR"]), "pt-BR");
        assert_eq!(best(pt, &["en", "pt", "pt-BR"]), "pt");
        let hant = "今天天氣很好，我們要去公園。";
        assert_eq!(best(hant, &["en", "zh-Hans"]), "zh-Hans");
        assert_eq!(best(hant, &["en", "zh-Hans", "zh-Hant"]), "zh-Hant");
        assert_eq!(
            best("今天天气很好，我们要去公园。", &["zh-Hant", "zh-Hans"]),
            "zh-Hans"
        );
        assert_eq!(
            best(
                "I dag er været fint, og vi går i parken.",
                &["en", "no", "de"]
            ),
            "no"
        );
    }

    #[test]
    fn no_letters_no_answer_and_unknown_scripts_fall_back() {
        assert!(detect("", &codes(ALL)).is_empty());
        assert!(detect("12345 67.8", &codes(ALL)).is_empty());
        assert!(detect("🙂👍 !!! ...", &codes(ALL)).is_empty());
        assert!(detect("Hello there, how are you?", &[]).is_empty());
        // Korean text on an English/German server: LibreTranslate's "en" with confidence 0.
        assert_eq!(
            detect("오늘은 날씨가 좋아서 공원에 갑니다.", &codes(&["de", "en"])),
            vec![("en".to_string(), 0.0)]
        );
        // Candidates whatlang does not know at all (Irish, Malay): the first, with 0.
        assert_eq!(
            detect("Dia duit, conas atá tú?", &codes(&["ga", "ms"])),
            vec![("ga".to_string(), 0.0)]
        );
    }
}
