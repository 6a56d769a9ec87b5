//! HTML pages as corpus text: what a reader sees of them.

/// The readable text of an HTML page: scripts, styles and tags dropped, common entities
/// decoded, runs of blank lines collapsed.
pub fn html_to_text(html: &str) -> String {
    let mut out = String::with_capacity(html.len() / 2);
    let lower = html.to_ascii_lowercase();
    let mut i = 0;
    let bytes = html.as_bytes();
    while i < bytes.len() {
        if bytes[i] == b'<' {
            let skip_to = |close: &str| lower[i..].find(close).map(|j| i + j + close.len());
            let end = if lower[i..].starts_with("<script") {
                skip_to("</script>")
            } else if lower[i..].starts_with("<style") {
                skip_to("</style>")
            } else {
                lower[i..].find('>').map(|j| i + j + 1)
            };
            i = end.unwrap_or(bytes.len());
            continue;
        }
        let next = lower[i..].find('<').map(|j| i + j).unwrap_or(bytes.len());
        out.push_str(&html[i..next]);
        i = next;
    }
    let decoded = out
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&#x27;", "'")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&");
    let mut text = String::with_capacity(decoded.len());
    let mut blank = 0;
    for line in decoded.lines() {
        if line.trim().is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_keeps_text_and_code_and_drops_markup() {
        let html = "<html><head><style>p{color:red}</style><script>var x = 1 < 2;</script></head>\n<body><h1>Ownership</h1>\n\n\n\n<pre><code>let s = String::from(&quot;hi&quot;);\nif a &lt; b &amp;&amp; c {}</code></pre></body></html>";
        let t = html_to_text(html);
        assert!(t.contains("Ownership"), "{t}");
        assert!(t.contains("let s = String::from(\"hi\");"), "{t}");
        assert!(t.contains("if a < b && c {}"), "{t}");
        assert!(!t.contains("color:red") && !t.contains("var x"), "{t}");
        assert!(!t.contains("\n\n\n"), "blank runs collapse: {t:?}");
    }
}
