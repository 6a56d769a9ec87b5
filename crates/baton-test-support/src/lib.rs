//! Helpers shared by the library's own tests.

use serde_json::Value;

/// The shape of a JSON document: every field name and how fields nest, with each value
/// replaced by its type (the first element stands for an array's). A snapshot of it
/// changes when a field is renamed, moved or retyped, not when a number does.
pub fn json_shape(v: &Value) -> String {
    let mut out = String::new();
    shape(v, 0, &mut out);
    out
}

fn shape(v: &Value, depth: usize, out: &mut String) {
    let pad = "  ".repeat(depth);
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match v {
                    Value::Object(_) => {
                        out.push_str(&format!("{pad}{k}: object\n"));
                        shape(v, depth + 1, out);
                    }
                    Value::Array(a) => match a.first() {
                        Some(first @ (Value::Object(_) | Value::Array(_))) => {
                            out.push_str(&format!("{pad}{k}: array of\n"));
                            shape(first, depth + 1, out);
                        }
                        Some(first) => {
                            out.push_str(&format!("{pad}{k}: array of {}\n", scalar(first)))
                        }
                        None => out.push_str(&format!("{pad}{k}: array (empty)\n")),
                    },
                    _ => out.push_str(&format!("{pad}{k}: {}\n", scalar(v))),
                }
            }
        }
        Value::Array(a) => {
            if let Some(first) = a.first() {
                shape(first, depth, out);
            }
        }
        _ => out.push_str(&format!("{pad}{}\n", scalar(v))),
    }
}

fn scalar(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Says that `test` (or a part of it) did not run and why, where the test output shows it:
/// written to the process's stderr directly, past the test harness's capture, so a skip
/// is never mistaken for a pass.
pub fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}
