use super::*;

/// A labelled set: each text with its sentences as a person would split them, joined by `|`.
/// Abbreviations, initials, decimals, ellipses, quotes, lists, line breaks, CJK, Arabic, Hindi,
/// German ordinals; the hard cases (where any rule-based splitter errs) are in it too, so the
/// measured precision and recall are not 100 % by construction.
const LABELLED: &[(&str, &str)] = &[
    // Plain prose
    ("Hello world.", "Hello world."),
    ("Hello world. How are you?", "Hello world.|How are you?"),
    ("It rains! We stay home.", "It rains!|We stay home."),
    ("Is it? Yes. No!", "Is it?|Yes.|No!"),
    ("One sentence only", "One sentence only"),
    (
        "First.Second starts without a space.",
        "First.|Second starts without a space.",
    ),
    (
        "The cat sat. The dog ran. The bird flew.",
        "The cat sat.|The dog ran.|The bird flew.",
    ),
    (
        "  Leading and trailing spaces.  ",
        "Leading and trailing spaces.",
    ),
    ("Tabs\tinside. And after.\t", "Tabs\tinside.|And after."),
    // Titles and abbreviations that never end a sentence
    (
        "Mr. Smith went to Washington.",
        "Mr. Smith went to Washington.",
    ),
    (
        "Mrs. Brown and Dr. Green met Prof. White.",
        "Mrs. Brown and Dr. Green met Prof. White.",
    ),
    (
        "We met Dr. Jones. He was late.",
        "We met Dr. Jones.|He was late.",
    ),
    (
        "Ms. Lee arrived. Mr. Park left.",
        "Ms. Lee arrived.|Mr. Park left.",
    ),
    (
        "Fruit, e.g. Apples, are healthy.",
        "Fruit, e.g. Apples, are healthy.",
    ),
    ("Use a tool, e.g. a hammer.", "Use a tool, e.g. a hammer."),
    (
        "Some languages (e.g. German) have cases.",
        "Some languages (e.g. German) have cases.",
    ),
    (
        "The answer, i.e. Forty-two, is known.",
        "The answer, i.e. Forty-two, is known.",
    ),
    (
        "Compare cf. Smith 2010. Then read on.",
        "Compare cf. Smith 2010.|Then read on.",
    ),
    (
        "It was Brazil vs. Germany. Germany won.",
        "It was Brazil vs. Germany.|Germany won.",
    ),
    (
        "He lives on St. Mark's Place.",
        "He lives on St. Mark's Place.",
    ),
    ("Gen. Patton led the army.", "Gen. Patton led the army."),
    ("Ask Sen. Warren. She knows.", "Ask Sen. Warren.|She knows."),
    (
        "It costs approx. Ten dollars.",
        "It costs approx. Ten dollars.",
    ),
    // Abbreviations before numbers
    ("See Fig. 3 for details.", "See Fig. 3 for details."),
    (
        "Read No. 5 first. It is short.",
        "Read No. 5 first.|It is short.",
    ),
    ("Is it true? No. It is not.", "Is it true?|No.|It is not."),
    ("See p. 12 and pp. 40-45.", "See p. 12 and pp. 40-45."),
    ("It is in Vol. 2, Ch. 4.", "It is in Vol. 2, Ch. 4."),
    (
        "The meeting is on Jan. 5 at noon.",
        "The meeting is on Jan. 5 at noon.",
    ),
    // Abbreviations that may end a sentence
    (
        "Bring pens, paper, etc. The shop is open.",
        "Bring pens, paper, etc.|The shop is open.",
    ),
    (
        "Apples, pears, etc. are fruit.",
        "Apples, pears, etc. are fruit.",
    ),
    (
        "He works for Acme Inc. The pay is good.",
        "He works for Acme Inc.|The pay is good.",
    ),
    ("Acme Inc. Announced a loss.", "Acme Inc. Announced a loss."),
    ("The U.S. Army is large.", "The U.S. Army is large."),
    (
        "She moved to the U.S. She likes it.",
        "She moved to the U.S.|She likes it.",
    ),
    (
        "It starts at 9 a.m. and ends at 5 p.m. today.",
        "It starts at 9 a.m. and ends at 5 p.m. today.",
    ),
    (
        "We left at 5 p.m. The sun was setting.",
        "We left at 5 p.m.|The sun was setting.",
    ),
    (
        "Martin Luther King Jr. Was a leader.",
        "Martin Luther King Jr. Was a leader.",
    ),
    ("He got a Ph.D. In physics.", "He got a Ph.D. In physics."),
    // Initials
    (
        "J. R. R. Tolkien wrote books.",
        "J. R. R. Tolkien wrote books.",
    ),
    (
        "The author is J. K. Rowling.",
        "The author is J. K. Rowling.",
    ),
    (
        "George W. Bush was president.",
        "George W. Bush was president.",
    ),
    ("Take vitamin C. Then rest.", "Take vitamin C.|Then rest."),
    (
        "I got an A. My parents were glad.",
        "I got an A.|My parents were glad.",
    ),
    ("He chose plan B. It failed.", "He chose plan B.|It failed."),
    (
        "The letter was from E. Hemingway.",
        "The letter was from E. Hemingway.",
    ),
    // Decimals, numbers, versions, times
    ("Pi is about 3.14 exactly.", "Pi is about 3.14 exactly."),
    (
        "It costs $3.50. That is cheap.",
        "It costs $3.50.|That is cheap.",
    ),
    (
        "Version 1.2.3 is out. Update now.",
        "Version 1.2.3 is out.|Update now.",
    ),
    (
        "The answer is 42. Next question.",
        "The answer is 42.|Next question.",
    ),
    (
        "It grew by 2.5% in 2023. Analysts were surprised.",
        "It grew by 2.5% in 2023.|Analysts were surprised.",
    ),
    ("We sold 1,000.5 tons.", "We sold 1,000.5 tons."),
    ("Meet me at 10.30 tomorrow.", "Meet me at 10.30 tomorrow."),
    // Ellipses
    ("Wait... what happened?", "Wait... what happened?"),
    (
        "I don't know... Maybe tomorrow.",
        "I don't know...|Maybe tomorrow.",
    ),
    ("Well… Let us see.", "Well…|Let us see."),
    ("So... the end.", "So... the end."),
    // Quotes and brackets
    ("\"Stop!\" he said.", "\"Stop!\" he said."),
    (
        "\"Why?\" she asked. Nobody answered.",
        "\"Why?\" she asked.|Nobody answered.",
    ),
    (
        "He said \"Hello.\" Then he left.",
        "He said \"Hello.\"|Then he left.",
    ),
    (
        "(This is a note.) The text goes on.",
        "(This is a note.)|The text goes on.",
    ),
    (
        "She whispered, \"Go now.\" He went.",
        "She whispered, \"Go now.\"|He went.",
    ),
    ("„Komm her!“ rief er.", "„Komm her!“ rief er."),
    (
        "«Bonjour!» dit-il. Il partit.",
        "«Bonjour!» dit-il.|Il partit.",
    ),
    ("“Really?” asked Tom. “Yes.”", "“Really?” asked Tom.|“Yes.”"),
    // URLs, e-mail, file names
    ("Visit example.com today.", "Visit example.com today."),
    (
        "Mail me at a.b@example.org. Thanks.",
        "Mail me at a.b@example.org.|Thanks.",
    ),
    (
        "Open the file report.pdf now.",
        "Open the file report.pdf now.",
    ),
    (
        "See https://example.com/a.b for more. Bye.",
        "See https://example.com/a.b for more.|Bye.",
    ),
    // Lists and line breaks
    ("Line one\nLine two", "Line one|Line two"),
    (
        "First paragraph.\n\nSecond paragraph.",
        "First paragraph.|Second paragraph.",
    ),
    ("1. Buy milk\n2. Buy eggs", "1.|Buy milk|2.|Buy eggs"),
    ("- apples\n- pears", "- apples|- pears"),
    (
        "Title\n\nA sentence. Another one.\n",
        "Title|A sentence.|Another one.",
    ),
    ("Dear Mr.\nSmith, hello.", "Dear Mr.|Smith, hello."),
    (
        "Windows\r\nline endings. Work too.",
        "Windows|line endings.|Work too.",
    ),
    // German
    ("Das ist gut. Wir gehen.", "Das ist gut.|Wir gehen."),
    ("Er kommt am 3. Mai zurück.", "Er kommt am 3. Mai zurück."),
    (
        "Der 2. Weltkrieg endete 1945.",
        "Der 2. Weltkrieg endete 1945.",
    ),
    ("Zum 1. Mal war er da.", "Zum 1. Mal war er da."),
    (
        "Am 24. Dezember ist Heiligabend.",
        "Am 24. Dezember ist Heiligabend.",
    ),
    ("Sie ist im 5. Stock.", "Sie ist im 5. Stock."),
    (
        "Im 19. Jahrhundert wuchs die Stadt.",
        "Im 19. Jahrhundert wuchs die Stadt.",
    ),
    (
        "Es gibt z.B. Äpfel und Birnen.",
        "Es gibt z.B. Äpfel und Birnen.",
    ),
    (
        "Das heißt, d.h. Alles bleibt.",
        "Das heißt, d.h. Alles bleibt.",
    ),
    (
        "Siehe S. 5 und vgl. Kapitel 2.",
        "Siehe S. 5 und vgl. Kapitel 2.",
    ),
    (
        "Wir treffen Hr. Müller. Er ist nett.",
        "Wir treffen Hr. Müller.|Er ist nett.",
    ),
    (
        "Das Ergebnis war 3. Danach gingen wir.",
        "Das Ergebnis war 3.|Danach gingen wir.",
    ),
    (
        "Bitte ruf an, bzw. Schreib eine Mail.",
        "Bitte ruf an, bzw. Schreib eine Mail.",
    ),
    (
        "Äpfel, Birnen usw. Das reicht.",
        "Äpfel, Birnen usw.|Das reicht.",
    ),
    (
        "Er wurde 3. Platz im Rennen.",
        "Er wurde 3. Platz im Rennen.",
    ),
    // French, Spanish, Italian, Portuguese
    (
        "M. Dupont est là. Il attend.",
        "M. Dupont est là.|Il attend.",
    ),
    (
        "Mme. Curie était physicienne.",
        "Mme. Curie était physicienne.",
    ),
    ("Bonjour. Comment ça va ?", "Bonjour.|Comment ça va ?"),
    ("¿Qué hora es? Son las tres.", "¿Qué hora es?|Son las tres."),
    ("¡Hola! ¿Cómo estás?", "¡Hola!|¿Cómo estás?"),
    ("El Sr. García llegó tarde.", "El Sr. García llegó tarde."),
    (
        "La Sra. López es médica. Trabaja mucho.",
        "La Sra. López es médica.|Trabaja mucho.",
    ),
    ("Ciao. Come stai?", "Ciao.|Come stai?"),
    ("Olá. Tudo bem?", "Olá.|Tudo bem?"),
    // CJK, Arabic, Hindi, Russian, Greek, Thai
    ("你好。我很好。", "你好。|我很好。"),
    (
        "今天天气很好！我们去公园吧？",
        "今天天气很好！|我们去公园吧？",
    ),
    (
        "これはペンです。あれは本です。",
        "これはペンです。|あれは本です。",
    ),
    (
        "「こんにちは。」と彼は言った。",
        "「こんにちは。」と彼は言った。",
    ),
    ("안녕하세요. 반갑습니다.", "안녕하세요.|반갑습니다."),
    ("كيف حالك؟ أنا بخير.", "كيف حالك؟|أنا بخير."),
    ("مرحبا! هذا نص.", "مرحبا!|هذا نص."),
    ("मैं ठीक हूँ। आप कैसे हैं?", "मैं ठीक हूँ।|आप कैसे हैं?"),
    ("Привет. Как дела?", "Привет.|Как дела?"),
    (
        "Это г. Москва, ул. Тверская.",
        "Это г. Москва, ул. Тверская.",
    ),
    ("Γεια σου. Τι κάνεις;", "Γεια σου.|Τι κάνεις;"),
    // Letterless pieces and odd input
    ("123", "123"),
    ("Ok. 42. Done.", "Ok.|42.|Done."),
    ("Wow!!! Really??", "Wow!!!|Really??"),
    ("Yes?! No.", "Yes?!|No."),
    ("Hi 🙂. Bye 👋.", "Hi 🙂.|Bye 👋."),
    ("The end", "The end"),
    // Mixed
    (
        "Dr. No is a film. It came out in 1962.",
        "Dr. No is a film.|It came out in 1962.",
    ),
    ("At 3 p.m. Dr. Who arrived.", "At 3 p.m. Dr. Who arrived."),
    (
        "The U.K. and the U.S. are allies.",
        "The U.K. and the U.S. are allies.",
    ),
    (
        "He read ch. 4 of vol. 2. Then he slept.",
        "He read ch. 4 of vol. 2.|Then he slept.",
    ),
    ("She said no. He said yes.", "She said no.|He said yes."),
];

/// Where each sentence starts (byte offsets), the first one excluded: the boundaries.
fn boundaries(text: &str, sentences: &[&str]) -> Vec<usize> {
    let mut at = 0;
    let mut out = Vec::new();
    for (i, s) in sentences.iter().enumerate() {
        let found = text[at..]
            .find(s)
            .unwrap_or_else(|| panic!("{s:?} not found in {text:?} after byte {at}"));
        if i > 0 {
            out.push(at + found);
        }
        at += found + s.len();
    }
    out
}

/// (true positives, predicted, expected, texts split exactly right) over the labelled set.
fn score(rules: bool) -> (usize, usize, usize, usize, Vec<String>) {
    let (mut tp, mut predicted, mut expected, mut exact) = (0, 0, 0, 0);
    let mut wrong = Vec::new();
    for (text, want) in LABELLED {
        let want: Vec<&str> = want.split('|').collect();
        let got = sentences(text, rules);
        let (w, g) = (boundaries(text, &want), boundaries(text, &got));
        tp += g.iter().filter(|b| w.contains(b)).count();
        predicted += g.len();
        expected += w.len();
        if w == g {
            exact += 1;
        } else {
            wrong.push(format!("{text:?}: got {got:?}"));
        }
    }
    (tp, predicted, expected, exact, wrong)
}

#[test]
fn boundary_precision_and_recall_on_the_labelled_set() {
    assert!(LABELLED.len() >= 100, "{} texts", LABELLED.len());
    for rules in [false, true] {
        let (tp, predicted, expected, exact, wrong) = score(rules);
        let precision = tp as f64 / predicted as f64;
        let recall = tp as f64 / expected as f64;
        eprintln!(
            "{}: {} texts, {expected} boundaries; precision {:.3} ({tp}/{predicted}), \
             recall {:.3}, texts exactly right {exact}",
            if rules {
                "UAX #29 + rules"
            } else {
                "UAX #29 alone"
            },
            LABELLED.len(),
            precision,
            recall,
        );
        for w in &wrong {
            eprintln!("  wrong: {w}");
        }
        if rules {
            assert!(precision >= 0.97, "precision {precision:.3}");
            assert!(recall >= 0.97, "recall {recall:.3}");
            assert!(wrong.len() <= 5, "{} texts wrong", wrong.len());
        }
    }
}

fn texts(segments: &[Segment]) -> Vec<(&str, bool)> {
    segments
        .iter()
        .map(|s| (s.text.as_str(), s.translate))
        .collect()
}

#[test]
fn separators_keep_whitespace_and_paragraphs_verbatim() {
    let text = "  Hello there. Mr. Smith came.\n\n\tNew paragraph!\r\nLast line  ";
    let segs = segment(text);
    assert_eq!(
        texts(&segs),
        vec![
            ("  ", false),
            ("Hello there.", true),
            (" ", false),
            ("Mr. Smith came.", true),
            ("\n\n\t", false),
            ("New paragraph!", true),
            ("\r\n", false),
            ("Last line", true),
            ("  ", false),
        ]
    );
    assert_eq!(
        segs.iter().map(|s| s.text.as_str()).collect::<String>(),
        text
    );
}

#[test]
fn letterless_pieces_are_kept_verbatim_and_joined_with_separators() {
    assert_eq!(
        texts(&segment("1. Buy milk\n2. Buy eggs")),
        vec![
            ("1. ", false),
            ("Buy milk", true),
            ("\n2. ", false),
            ("Buy eggs", true)
        ]
    );
    assert_eq!(texts(&segment("123 456")), vec![("123 456", false)]);
    assert_eq!(texts(&segment("🙂")), vec![("🙂", false)]);
    assert!(segment("").is_empty());
    assert_eq!(texts(&segment(" \n ")), vec![(" \n ", false)]);
}

#[test]
fn cjk_sentences_may_be_adjacent() {
    assert_eq!(
        texts(&segment("你好。我很好。")),
        vec![("你好。", true), ("我很好。", true)]
    );
}

proptest::proptest! {
    #[test]
    fn segments_concatenate_to_the_input(text in "(\\PC|[ \n\r\t.?!。]){0,80}") {
        let segs = segment(&text);
        proptest::prop_assert_eq!(segs.iter().map(|s| s.text.as_str()).collect::<String>(), text);
        for pair in segs.windows(2) {
            proptest::prop_assert!(pair[0].translate || pair[1].translate, "{:?}", segs);
        }
        for s in &segs {
            proptest::prop_assert!(!s.text.is_empty());
            if s.translate {
                proptest::prop_assert_eq!(s.text.trim(), s.text.as_str());
            }
        }
    }
}

/// Over a corpus of one text per line (`SEGMENT_CORPUS=path`): how many lines split into more
/// than one sentence, and every 1/20th of those printed, to read for errors.
#[test]
#[ignore = "needs SEGMENT_CORPUS=<one text per line>"]
fn corpus_split_counts() {
    let path = std::env::var("SEGMENT_CORPUS").expect("SEGMENT_CORPUS");
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let split: Vec<(&str, Vec<&str>)> = lines
        .iter()
        .map(|l| (*l, sentences(l, true)))
        .filter(|(_, s)| s.len() > 1)
        .collect();
    let uax_only = lines
        .iter()
        .filter(|l| sentences(l, false).len() > 1)
        .count();
    eprintln!(
        "{} lines, {} split into >1 sentence ({} with UAX #29 alone)",
        lines.len(),
        split.len(),
        uax_only
    );
    let step = (split.len() / 20).max(1);
    for (line, s) in split.iter().step_by(step).take(20) {
        eprintln!("--- {line}\n    {s:?}");
    }
    let mut joined = 0;
    for l in &lines {
        let (a, b) = (sentences(l, false), sentences(l, true));
        if a.len() != b.len() && joined < 15 {
            joined += 1;
            eprintln!("=== rules changed: {a:?}\n    -> {b:?}");
        }
    }
}

#[test]
fn a_period_inside_a_word_is_no_boundary() {
    assert_eq!(
        sentences("YOU ACCEPT UNICODE INC.'S DATA FILES. Then it ends.", true),
        vec!["YOU ACCEPT UNICODE INC.'S DATA FILES.", "Then it ends."]
    );
    // Nor a question or exclamation mark inside an address or a name.
    assert_eq!(
        sentences(
            "See https://codesearch.debian.net/search?q=This+file or dir?ci=trunk here. Yahoo!Mail works! Does it? Yes.",
            true
        ),
        vec![
            "See https://codesearch.debian.net/search?q=This+file or dir?ci=trunk here.",
            "Yahoo!Mail works!",
            "Does it?",
            "Yes."
        ]
    );
    // Scripts without spaces keep theirs.
    assert_eq!(
        sentences("你好。我很好。", true),
        vec!["你好。", "我很好。"]
    );
    assert_eq!(
        sentences("你好吗？我很好！", true),
        vec!["你好吗？", "我很好！"]
    );
}
