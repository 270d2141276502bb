//! Sizes on the command line: `4096`, `128K`, `128KiB`, `1.5G`, `64m`. Binary units.

/// Parse a byte count; the error names the bad text.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("bad size {s:?}: unknown unit {unit:?} (use K, M, G or T)")),
    };
    let n: f64 = num.parse().map_err(|_| format!("bad size {s:?}: expected a number like 128K or 4G"))?;
    if !n.is_finite() || n < 0.0 || n * mult as f64 > u64::MAX as f64 {
        return Err(format!("bad size {s:?}: out of range"));
    }
    Ok((n * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("128K"), Ok(128 << 10));
        assert_eq!(parse_size("128KiB"), Ok(128 << 10));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("abc").is_err());
        assert!(parse_size("").is_err());
    }
}
