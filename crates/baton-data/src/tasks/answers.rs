//! Reading the answer of a generation task (GSM8K): the number a chain-of-thought answer
//! ends on, normalised as the request files name.

/// The number a chain-of-thought answer ends on: the one after the last "answer is",
/// else the last number in the text; commas, `$` and a trailing period are dropped (the
/// normalisation the request files name).
pub fn extract_number(text: &str) -> Option<String> {
    let lower = text.to_lowercase();
    let tail = match lower.rfind("answer is") {
        Some(i) => &text[i + "answer is".len()..],
        None => text,
    };
    let numbers = numbers_in(tail);
    let pick = if lower.contains("answer is") {
        numbers.first()
    } else {
        numbers.last()
    };
    pick.map(|s| normalize_number(s))
}

fn numbers_in(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let chars: Vec<char> = s.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let starts_negative =
            c == '-' && cur.is_empty() && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit());
        if c.is_ascii_digit() || starts_negative || (!cur.is_empty() && (c == ',' || c == '.')) {
            cur.push(c);
        } else if !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

pub fn normalize_number(s: &str) -> String {
    let mut t: String = s.chars().filter(|c| *c != ',' && *c != '$').collect();
    while t.ends_with('.') {
        t.pop();
    }
    // "18.00" and "18" are the same answer.
    if let Some((int, frac)) = t.split_once('.') {
        if frac.chars().all(|c| c == '0') {
            t = int.to_string();
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_extracted_from_the_final_answer_sentence() {
        assert_eq!(
            extract_number("She makes 9 * 2 = $18. So the answer is 18.").as_deref(),
            Some("18")
        );
        assert_eq!(
            extract_number("so 1,234 - 4 = 1,230. The answer is $1,230.00.").as_deref(),
            Some("1230")
        );
        assert_eq!(
            extract_number("It drops to -5 then 7").as_deref(),
            Some("7")
        );
        assert_eq!(extract_number("answer is -3.").as_deref(), Some("-3"));
        assert_eq!(extract_number("no digits here"), None);
    }
}
