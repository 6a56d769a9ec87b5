//! Parity of the GGUF-built tokenizer with the model family's own `tokenizer.json`, and
//! fingerprint checks across real GGUF files.
//!
//! Inputs come from the environment; each test prints a note and passes when its files are
//! not configured:
//! - `BATON_TEST_QWEN_GGUF`: a Qwen2.5 GGUF (e.g. Qwen2.5-Coder-0.5B-Instruct).
//! - `BATON_TEST_QWEN_TOKENIZER_JSON`: a Qwen `tokenizer.json` (Qwen2.5 or Qwen3: Qwen3 only
//!   adds tokens after Qwen2.5's, which the strings here do not use).
//! - `BATON_TEST_QWEN_GGUF_2`: a second GGUF of the same family (e.g. the 1.5B).
//! - `BATON_TEST_OTHER_GGUF`: a GGUF of another family (e.g. SmolLM2-135M-Instruct).
//! - `BATON_TEST_LLAMA3_TOKENIZER_JSON`: a Llama 3 `tokenizer.json`; its vocabulary is put
//!   into GGUF-style metadata (pre `llama-bpe`) to check that route against the file.

use std::collections::HashMap;
use std::path::PathBuf;

use baton::text::{ensure_same_tokenizer, TextTokenizer};
use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};

mod common;

fn gguf_tokenizer(path: &PathBuf) -> TextTokenizer {
    let mut f = std::fs::File::open(path).expect("open gguf");
    let content = Content::read(&mut f).expect("read gguf metadata");
    TextTokenizer::from_gguf(&content).expect("tokenizer from gguf")
}

/// Deterministic xorshift, so that the generated strings are the same on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

const SNIPPETS: &[&str] = &[
    // code
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    println!(\"{:?}\", v);\n}\n",
    "impl<'a, T: Clone + Send> Iterator for Foo<'a, T> {\n\ttype Item = &'a T;\n}",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(20)])",
    "class Foo(object):\n    \"\"\"Docstring with 'quotes' and \\\"escapes\\\".\"\"\"\n    def __init__(self, x=1e-9):\n        self._x = x  # comment\n",
    "const add = (a, b) => a + b;\nexport default async function handler(req, res) { await res.json({ ok: true }); }",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"héllo, 世界\")\n}",
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total > 100.50 GROUP BY u.id;",
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"></head>\n  <body>\n    <div class=\"a b\">&nbsp;&amp;</div>\n  </body>\n</html>",
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\" | tr 'a-z' 'A-Z'; done 2>&1 >/dev/null",
    "{\"name\": \"baton\", \"version\": \"0.1.0\", \"deps\": [1, 2.5, -3e10, null, true]}",
    "    if (x != y && !z) { return x->next[i++]; }   // trailing   \n",
    "λx. λy. x y  -- lambda calculus; ∀ε>0 ∃δ>0: |x−a|<δ ⇒ |f(x)−f(a)|<ε",
    "public static void main(String[] args) throws IOException { System.out.println(args.length); }",
    "x = [1,2,3]\r\ny = {'a': 1}\r\n\r\nprint(x, y)\r\n",
    // prose
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll agree: we've done it, they'd say, it's fine, and you're right; I'LL SEE, DON'T WORRY.",
    "It was the best of times, it was the worst of times, it was the age of wisdom...",
    "Ünïcödé façade naïve café résumé coöperate — “smart quotes” and ‘single’ ones…",
    "Der Straßenbahnfahrer überquerte die Kreuzung; Äpfel, Öl und Übermut.",
    "¿Dónde está la biblioteca? ¡Está aquí, señor!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "مرحبا بالعالم! هذه جملة عربية.",
    "שלום עולם, זה משפט בעברית.",
    "नमस्ते दुनिया, यह एक हिंदी वाक्य है।",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง",
    // CJK
    "你好，世界！这是一个测试句子，包含中文标点。",
    "日本語のテキスト：ひらがな、カタカナ、漢字を含みます。",
    "한국어 문장입니다. 안녕하세요!",
    "混合 mixed 文本 text 123 テスト",
    // emoji
    "😀😃😄 emoji test 🎉🎉",
    "👨‍👩‍👧‍👦 family, 👍🏽 thumbs, 🇫🇷🇯🇵 flags, ❤️ heart",
    "🦀 Rust + 🐍 Python = 💥",
    // combining marks (NFC matters here)
    "e\u{301}cole, n\u{303}, a\u{308}, A\u{30a}ngstro\u{308}m",
    "Z\u{351}\u{36b}\u{343}\u{36a}a\u{302}\u{352}l\u{350}g\u{30c}o\u{36d}",
    "\u{1100}\u{1161}\u{11a8} hangul jamo, \u{0915}\u{094d}\u{0937} conjunct",
    // whitespace
    "   leading spaces",
    "trailing spaces   ",
    "a\t\tb\t \tc",
    "line1\n\n\nline2\n \n  \nline3",
    "\n\n\n",
    "    \n    \n",
    " ",
    "\t",
    "\r\n\r\n",
    "a  b   c    d     e",
    // numbers
    "1234567890 12 345 6789 0.5 -3.14159 1e10 0xDEADBEEF 1_000_000",
    "٣٤٥ ໑໒໓ ①②③ Ⅻ ½ ¾",
    "In 2024, 3,141,592 people paid $19.99 (or €17,50) each.",
    // special tokens
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|><|im_start|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "<|fim_prefix|>def f(<|fim_suffix|>):\n    pass<|fim_middle|>",
    "<|im_start |> not special <| im_end|>",
    // misc
    "",
    "a",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE",
    "https://example.com/path?q=1&r=two#frag",
    "user@example.org, +1 (555) 123-4567",
    "~!@#$%^&*()_+`-={}|[]\\:\";'<>?,./",
    "....!!!???,,,;;;:::",
    "ǅ ǈ ǋ ǲ titlecase, ﬁ ﬂ ligatures, Å Ω K compat",
    "\u{200b}zero\u{200b}width\u{feff}bom\u{00a0}nbsp",
];

const PIECES: &[&str] = &[
    " ",
    "  ",
    "\n",
    "\t",
    "\r\n",
    "a",
    "Z",
    "é",
    "e\u{301}",
    "世",
    "界",
    "😀",
    "👍🏽",
    "0",
    "42",
    "1234",
    "'s",
    "'LL",
    "don't",
    "-",
    "_",
    ".",
    "...",
    "(",
    ")",
    "{",
    "}",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "fn",
    "def",
    "return",
    "the",
    "The",
    " the",
    "ß",
    "Ω",
    "ㄱ",
    "ー",
    "،",
    "\u{300}",
    "→",
    "€",
    "$",
    "#",
    "//",
    "/*",
    "*/",
    "\\n",
    "\"",
    "'",
    "`",
];

fn generated_strings() -> Vec<String> {
    let mut out: Vec<String> = SNIPPETS.iter().map(|s| s.to_string()).collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // Pairs of snippets with assorted separators.
    let seps = ["", " ", "\n", "\n\n", "\t", "  ", "<|im_end|>\n"];
    for _ in 0..120 {
        let a = rng.pick(SNIPPETS);
        let b = rng.pick(SNIPPETS);
        let sep = rng.pick(&seps);
        out.push(format!("{a}{sep}{b}"));
    }
    // Random piece soups: boundaries between scripts, spaces, digits and specials.
    for _ in 0..150 {
        let n = 1 + (rng.next() % 24) as usize;
        let mut s = String::new();
        for _ in 0..n {
            let piece: &str = rng.pick::<&str>(PIECES);
            s.push_str(piece);
        }
        out.push(s);
    }
    out
}

#[test]
fn gguf_tokenizer_matches_tokenizer_json() {
    let (gguf, json) = (common::qwen_small(), common::qwen_tokenizer_json());
    let from_gguf = gguf_tokenizer(&gguf);
    let from_json = TextTokenizer::from_tokenizer_json(&json).expect("tokenizer.json");
    let strings = generated_strings();
    assert!(strings.len() >= 200);
    let mut mismatches = Vec::new();
    for s in &strings {
        let a = from_gguf.encode(s).expect("encode gguf");
        let b = from_json.encode(s).expect("encode json");
        if a != b {
            mismatches.push(format!("{s:?}\n  gguf: {a:?}\n  json: {b:?}"));
        }
        // Byte-level BPE decodes back to the NFC-normalised input.
        let back = from_gguf.decode(&a).expect("decode");
        assert_eq!(
            back,
            from_json.decode(&b).expect("decode json"),
            "decode of {s:?}"
        );
    }
    eprintln!(
        "parity: {} strings, {} mismatches",
        strings.len(),
        mismatches.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} of {} strings differ:\n{}",
        mismatches.len(),
        strings.len(),
        mismatches.join("\n")
    );
    // Control and end-of-turn tokens are single ids.
    let im_end = from_gguf.token_to_id("<|im_end|>").expect("<|im_end|>");
    assert_eq!(im_end, 151645);
    assert_eq!(
        from_gguf.encode("<|im_end|>").expect("encode"),
        vec![im_end]
    );
    assert!(from_gguf.eos_ids().contains(&im_end));
    assert!(from_gguf.eos_ids().contains(&151643));
    assert_eq!(from_gguf.bos_id(), Some(151643));
    assert_eq!(from_gguf.vocab_size(), 151936);
}

#[test]
fn same_family_same_fingerprint_other_family_differs() {
    let (a, b) = (common::qwen_small(), common::qwen_large());
    let ta = gguf_tokenizer(&a);
    let tb = gguf_tokenizer(&b);
    assert_eq!(ta.fingerprint(), tb.fingerprint());
    ensure_same_tokenizer(&ta, &tb).expect("same family");
    eprintln!("qwen fingerprint: {}", ta.fingerprint());

    let other = common::smollm();
    let tc = gguf_tokenizer(&other);
    assert_ne!(ta.fingerprint(), tc.fingerprint());
    let err = ensure_same_tokenizer(&ta, &tc).expect_err("different family");
    let msg = err.to_string();
    assert!(msg.contains("different tokenizers"), "{msg}");
    assert!(
        msg.contains(ta.fingerprint()) && msg.contains(tc.fingerprint()),
        "{msg}"
    );
    // SmolLM2 matches its special tokens and splits digits one by one (the space before a
    // number stays its own pre-token, as with HF's Digits + ByteLevel pipeline).
    let ids = tc.encode("<|im_start|>user 2024").expect("encode");
    assert_eq!(ids[0], 1, "{ids:?}");
    assert_eq!(ids.len(), 1 + 2 + 4, "{ids:?}");
    assert_eq!(tc.decode(&ids).expect("decode"), "<|im_start|>user 2024");
}

/// GGUF-style metadata holding the vocabulary, merges and added tokens of a `tokenizer.json`,
/// as llama.cpp's converter writes them.
fn content_from_tokenizer_json(path: &PathBuf, pre: &str) -> Content {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json");
    let model = &json["model"];
    let mut tokens: Vec<Option<(String, i32)>> = Vec::new();
    let mut put = |id: usize, tok: &str, ty: i32| {
        if tokens.len() <= id {
            tokens.resize(id + 1, None);
        }
        tokens[id] = Some((tok.to_string(), ty));
    };
    for (tok, id) in model["vocab"].as_object().expect("vocab") {
        put(id.as_u64().expect("id") as usize, tok, 1);
    }
    for t in json["added_tokens"].as_array().expect("added_tokens") {
        let ty = if t["special"].as_bool() == Some(true) {
            3
        } else {
            4
        };
        put(
            t["id"].as_u64().expect("id") as usize,
            t["content"].as_str().expect("content"),
            ty,
        );
    }
    let merges: Vec<Value> = model["merges"]
        .as_array()
        .expect("merges")
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => Value::String(s.clone()),
            serde_json::Value::Array(p) => Value::String(format!(
                "{} {}",
                p[0].as_str().expect("merge"),
                p[1].as_str().expect("merge")
            )),
            other => panic!("merge {other:?}"),
        })
        .collect();
    let (names, types): (Vec<Value>, Vec<Value>) = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let (s, ty) = t.unwrap_or_else(|| (format!("[PAD{i}]"), 5));
            (Value::String(s), Value::I32(ty))
        })
        .unzip();
    let mut md = HashMap::new();
    md.insert(
        "tokenizer.ggml.model".to_string(),
        Value::String("gpt2".into()),
    );
    md.insert("tokenizer.ggml.pre".to_string(), Value::String(pre.into()));
    md.insert("tokenizer.ggml.tokens".to_string(), Value::Array(names));
    md.insert("tokenizer.ggml.token_type".to_string(), Value::Array(types));
    md.insert("tokenizer.ggml.merges".to_string(), Value::Array(merges));
    Content {
        magic: VersionedMagic::GgufV3,
        metadata: md,
        tensor_infos: HashMap::new(),
        tensor_data_offset: 0,
    }
}

#[test]
fn llama3_gguf_route_matches_tokenizer_json() {
    let json = common::llama3_tokenizer_json();
    let from_meta = TextTokenizer::from_gguf(&content_from_tokenizer_json(&json, "llama-bpe"))
        .expect("gguf route");
    let from_json = TextTokenizer::from_tokenizer_json(&json).expect("tokenizer.json");
    let mut strings = generated_strings();
    strings.push("<|begin_of_text|>Hello<|eot_id|><|start_header_id|>user<|end_header_id|>".into());
    let mut mismatches = Vec::new();
    for s in &strings {
        let a = from_meta.encode_raw(s).expect("encode");
        let b = from_json.encode_raw(s).expect("encode");
        if a != b {
            mismatches.push(format!("{s:?}\n  gguf: {a:?}\n  json: {b:?}"));
        }
    }
    eprintln!(
        "llama3 parity: {} strings, {} mismatches",
        strings.len(),
        mismatches.len()
    );
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    let eot = from_meta.token_to_id("<|eot_id|>").expect("eot");
    assert!(from_meta.eos_ids().contains(&eot));
}
