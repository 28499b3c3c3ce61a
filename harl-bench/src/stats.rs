//! Statistics the bench commands share, so that every table takes its medians the same way.

/// The median of `values`, the mean of the middle two for an even count. NaN is a missing value
/// and is left out; infinities take part (a seed that never reached a target counts as
/// infinitely late), and a median that comes out infinite is `None`, as is that of nothing.
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let m = match v.len() {
        0 => return None,
        n if n % 2 == 0 => (v[mid - 1] + v[mid]) / 2.0,
        _ => v[mid],
    };
    m.is_finite().then_some(m)
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn odd_counts_take_the_middle_even_counts_the_mean_of_the_middle_two() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
    }

    #[test]
    fn nan_is_left_out_and_nothing_has_no_median() {
        assert_eq!(median(&[f64::NAN, 5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn infinities_count_and_an_infinite_median_is_none() {
        assert_eq!(median(&[1.0, 2.0, f64::INFINITY]), Some(2.0));
        assert_eq!(median(&[2.0, f64::INFINITY]), None);
        assert_eq!(median(&[1.0, f64::INFINITY, f64::INFINITY]), None);
    }
}
