//! A1111 infotext: the exact text, A1111's parser, and the PNG chunk it travels in.

use zimage::formats::infotext::{self, Infotext};
use zimage::image_out::{read_png_text, write_png, PARAMETERS_KEY};

const PARAMS: [(&str, &str); 10] = [
    ("Steps", "20"),
    ("Sampler", "DPM++ 2M"),
    ("Schedule type", "Karras"),
    ("CFG scale", "7"),
    ("Seed", "1234"),
    ("Size", "512x768"),
    ("Model hash", "6c6a70ac2a"),
    ("Model", "model3m"),
    ("Lora hashes", "myLora: 93019167b979"),
    ("Version", "v1.10.1"),
];

const EXAMPLE: &str = "a red fox, snow\nNegative prompt: blurry, lowres\nSteps: 20, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 7, Seed: 1234, Size: 512x768, Model hash: 6c6a70ac2a, Model: model3m, Lora hashes: \"myLora: 93019167b979\", Version: v1.10.1";

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn formats_the_a1111_example_exactly() {
    assert_eq!(
        infotext::format("a red fox, snow", "blurry, lowres", &PARAMS),
        EXAMPLE
    );
}

#[test]
fn parses_the_a1111_example() {
    let parsed = infotext::parse(EXAMPLE);
    assert_eq!(parsed.prompt, "a red fox, snow");
    assert_eq!(parsed.negative_prompt, "blurry, lowres");
    assert_eq!(parsed.params, owned(&PARAMS));
    assert_eq!(parsed.get("Lora hashes"), Some("myLora: 93019167b979"));
}

#[test]
fn empty_negative_prompt_leaves_out_its_line() {
    let text = infotext::format("a fox", "", &[("Steps", "8"), ("Seed", "1")]);
    assert_eq!(text, "a fox\nSteps: 8, Seed: 1");
    // The whole text is stripped, so an empty prompt leaves no blank first line.
    assert_eq!(infotext::format("", "", &[("Steps", "8")]), "Steps: 8");
}

#[test]
fn quotes_only_commas_newlines_and_colons() {
    assert_eq!(infotext::quote("Euler a"), "Euler a");
    assert_eq!(
        infotext::quote("say \"hi\""),
        "say \"hi\"",
        "a quote alone is not quoted"
    );
    assert_eq!(infotext::quote("a, b"), "\"a, b\"");
    assert_eq!(infotext::quote("a: b"), "\"a: b\"");
    assert_eq!(infotext::quote("a\nb \"c\""), "\"a\\nb \\\"c\\\"\"");
    assert_eq!(
        infotext::quote("café, 狐"),
        "\"café, 狐\"",
        "non-ASCII stays as it is"
    );
    // A pair whose key and value are equal is written as the key alone.
    assert_eq!(
        infotext::format("p", "", &[("Tiling", "Tiling"), ("A", "1"), ("B", "2")]),
        "p\nTiling, A: 1, B: 2"
    );
}

#[test]
fn parses_multi_line_prompts_and_negatives() {
    let text =
        "line one\n  line two  \nNegative prompt: bad\nworse\nSteps: 4, Seed: 9, Size: 64x48";
    let parsed = infotext::parse(text);
    assert_eq!(parsed.prompt, "line one\nline two");
    assert_eq!(parsed.negative_prompt, "bad\nworse");
    assert_eq!(
        parsed.params,
        owned(&[("Steps", "4"), ("Seed", "9"), ("Size", "64x48")])
    );
}

#[test]
fn a_last_line_with_fewer_than_three_pairs_is_prompt() {
    let parsed = infotext::parse("a portrait\nstyle: oil, mood: calm");
    assert_eq!(parsed.prompt, "a portrait\nstyle: oil, mood: calm");
    assert!(parsed.params.is_empty());
    assert_eq!(
        infotext::parse("just a prompt"),
        Infotext {
            prompt: "just a prompt".into(),
            ..Default::default()
        }
    );
}

#[test]
fn parser_follows_a1111_on_odd_values() {
    let parsed = infotext::parse("p\nAa: 1, Empty:, Bad: \"unterminated, Cc: \"x\\\"y\", Aa: 2");
    // An empty value is dropped; a key given twice keeps its place and takes the last value.
    assert_eq!(
        parsed.params,
        owned(&[("Aa", "2"), ("Bad", "\"unterminated"), ("Cc", "x\"y")])
    );
    // Keys need two characters, so here only two pairs match and the line is prompt.
    let parsed = infotext::parse("p\nA: 1, B: 2, Cc: 3, Dd: 4");
    assert_eq!(parsed.prompt, "p\nA: 1, B: 2, Cc: 3, Dd: 4");
}

#[test]
fn round_trips() {
    let params = [
        ("Steps", "8"),
        ("Sampler", "Euler"),
        ("Schedule type", "Flow matching, shift 3"),
        ("Note", "two\nlines: \"quoted\", 狐"),
        ("Seed", "42"),
    ];
    let text = infotext::format("a fox\nin snow", "blur", &params);
    let parsed = infotext::parse(&text);
    assert_eq!(parsed.prompt, "a fox\nin snow");
    assert_eq!(parsed.negative_prompt, "blur");
    assert_eq!(parsed.params, owned(&params));
}

/// The chunk types of a PNG file, with their keywords for text chunks.
fn text_chunk_types(bytes: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut at = 8;
    while at + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let kind = String::from_utf8_lossy(&bytes[at + 4..at + 8]).to_string();
        let data = &bytes[at + 8..at + 8 + len];
        if kind.ends_with("Xt") || kind == "tEXt" {
            let key = data.split(|&b| b == 0).next().unwrap();
            out.push((kind, String::from_utf8_lossy(key).to_string()));
        }
        at += 12 + len;
    }
    out
}

#[test]
fn png_text_is_text_for_latin1_and_itxt_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let rgb = vec![128u8; 4 * 3 * 3];
    for (prompt, chunk) in [
        ("a café in the snow", "tEXt"),
        ("a fox 狐 in the snow", "iTXt"),
    ] {
        let path = dir.path().join(format!("{chunk}.png"));
        let params = infotext::format(prompt, "", &PARAMS);
        write_png(
            &path,
            &rgb,
            4,
            3,
            &[(PARAMETERS_KEY, &params), ("zimage", "{}")],
        )
        .unwrap();
        let types = text_chunk_types(&std::fs::read(&path).unwrap());
        assert!(
            types.contains(&(chunk.to_string(), PARAMETERS_KEY.to_string())),
            "{types:?}"
        );
        assert!(
            types.contains(&("tEXt".to_string(), "zimage".to_string())),
            "{types:?}"
        );
        let text = read_png_text(&path).unwrap();
        let read = &text.iter().find(|(k, _)| k == PARAMETERS_KEY).unwrap().1;
        assert_eq!(read, &params);
        assert_eq!(infotext::parse(read).prompt, prompt);
    }
}
