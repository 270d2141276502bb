//! Checking the value given to a settable parameter (`set-param`), the same way for every
//! service: an error names the parameter and what it takes, and nothing changes.

use std::fmt::Display;
use std::ops::RangeInclusive;
use std::str::FromStr;

/// `value` read as a number of `unit` within `range`, for parameter `leaf`.
pub(crate) fn number<T>(leaf: &str, value: &str, unit: &str, range: RangeInclusive<T>) -> Result<T, String>
where
    T: FromStr + PartialOrd + Display,
{
    let v: T = value.parse().map_err(|_| format!("{leaf} {value:?} is not a number of {unit}"))?;
    if !range.contains(&v) {
        return Err(format!("{leaf} {v}: from {} to {}", range.start(), range.end()));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_out_of_range_or_not_a_number_is_named() {
        assert_eq!(number("commit_interval_ms", "200", "milliseconds", 1..=60_000u64), Ok(200));
        assert_eq!(
            number("commit_interval_ms", "soon", "milliseconds", 1..=60_000u64),
            Err("commit_interval_ms \"soon\" is not a number of milliseconds".into())
        );
        assert_eq!(
            number("lease_max", "0", "leases", 1..=1usize << 30),
            Err("lease_max 0: from 1 to 1073741824".into())
        );
    }
}
