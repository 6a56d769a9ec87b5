//! How two answers to the same turn compare, token by token.

/// Whether the answers are identical, the first index where they differ (a shorter
/// answer that is a prefix of the longer differs where it ends), and the share of
/// positions, over the longer answer, holding the same token.
pub fn compare_tokens(a: &[u32], b: &[u32]) -> (bool, Option<usize>, f64) {
    let longest = a.len().max(b.len());
    if longest == 0 {
        return (true, None, 1.0);
    }
    let same = a.iter().zip(b).filter(|(x, y)| x == y).count();
    let first = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())));
    (first.is_none(), first, same as f64 / longest as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_answers_agree_everywhere() {
        assert_eq!(compare_tokens(&[1, 2, 3], &[1, 2, 3]), (true, None, 1.0));
        assert_eq!(compare_tokens(&[], &[]), (true, None, 1.0));
    }

    #[test]
    fn the_first_difference_and_the_agreement_rate_are_reported() {
        assert_eq!(
            compare_tokens(&[1, 2, 3, 4], &[1, 9, 3, 4]),
            (false, Some(1), 0.75)
        );
        // A prefix differs where it ends.
        assert_eq!(
            compare_tokens(&[1, 2], &[1, 2, 3, 4]),
            (false, Some(2), 0.5)
        );
        assert_eq!(compare_tokens(&[], &[5]), (false, Some(0), 0.0));
    }
}
