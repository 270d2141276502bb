//! Shell-style patterns for NIDs and job ids in TBF and fault rules: `*` matches any run
//! of characters, `?` any one. Linear time with one backtrack point, so a hostile pattern
//! cannot make matching explode.

/// `*` matches any run of characters, `?` any one.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globs() {
        assert!(glob("10.0.0.*@tcp*", "10.0.0.7@tcp:988"));
        assert!(!glob("10.0.0.*@tcp", "10.0.1.7@tcp"));
        assert!(glob("dd.?", "dd.0"));
        assert!(glob("*", ""));
        assert!(!glob("a*b", "acd"));
        assert!(glob("*a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaab"));
        assert!(!glob("*a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
    }
}
