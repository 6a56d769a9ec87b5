//! One line for an error and its causes. Many library errors already write their cause
//! into their own message ("i/o error on X: File exists (os error 17)"), so printing the
//! chain as it stands would say the cause twice.

/// The error's message followed by each cause that the text so far does not already say.
pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        let text = without_backtrace(&text);
        if text.is_empty() || line.contains(text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(text);
    }
    line
}

/// `text` without the backtrace that a library error (candle's, with RUST_BACKTRACE set)
/// writes after its message: the frames start on a line of their own, numbered from 0.
fn without_backtrace(text: &str) -> &str {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if at > 0 && line.trim_start().starts_with("0: ") {
            return text[..at].trim_end();
        }
        at += line.len();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("i/o error on afile: {source}")]
    struct WithCause {
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_said_once() {
        let io = std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "File exists (os error 17)",
        );
        let e = anyhow::Error::new(WithCause { source: io });
        assert_eq!(
            error_line(&e),
            "i/o error on afile: File exists (os error 17)"
        );
    }

    #[test]
    fn causes_not_in_the_message_are_kept_in_order() {
        let e = anyhow::anyhow!("disk full").context("cannot save the mapper");
        let e = e.context("calibration failed");
        assert_eq!(
            error_line(&e),
            "calibration failed: cannot save the mapper: disk full"
        );
    }

    #[test]
    fn a_library_backtrace_is_left_out_of_the_line() {
        let e = anyhow::anyhow!(
            "shape mismatch in matmul\n   0: candle_core::error::Error::bt\n   1: main"
        );
        assert_eq!(error_line(&e), "shape mismatch in matmul");
        let e = anyhow::anyhow!("two lines\nof a message");
        assert_eq!(error_line(&e), "two lines\nof a message");
    }
}
