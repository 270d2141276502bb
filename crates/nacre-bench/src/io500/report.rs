//! IO500's figures: one result per phase, the score as IO500 computes it (geometric means
//! of the bandwidth phases in GiB/s and of the metadata phases in kIOPS, and the square
//! root of their product), and the text IO500 prints.

use serde_json::{Value, json};

/// A phase's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    GiBs,
    KIops,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::GiBs => "GiB/s",
            Unit::KIops => "kIOPS",
        }
    }
}

/// What one phase measured.
#[derive(Debug, Clone)]
pub struct PhaseResult {
    pub name: &'static str,
    pub unit: Unit,
    /// GiB/s or kIOPS.
    pub value: f64,
    pub seconds: f64,
    /// Bytes moved (ior phases) or operations done (mdtest, find).
    pub amount: u64,
    /// Part of the score (`[RESULT]`), or listed only (`[      ]`), as ISC25's
    /// ior-rnd4K-easy-read.
    pub scored: bool,
    /// A write phase: whether the stonewall ended it (false: every task reached its size
    /// cap first, which a valid IO500 submission does not allow).
    pub stonewalled: Option<bool>,
}

impl PhaseResult {
    pub fn bandwidth(name: &'static str, bytes: u64, seconds: f64) -> PhaseResult {
        let value = bytes as f64 / (1u64 << 30) as f64 / seconds.max(1e-9);
        PhaseResult { name, unit: Unit::GiBs, value, seconds, amount: bytes, scored: true, stonewalled: None }
    }

    pub fn rate(name: &'static str, ops: u64, seconds: f64) -> PhaseResult {
        let value = ops as f64 / 1000.0 / seconds.max(1e-9);
        PhaseResult { name, unit: Unit::KIops, value, seconds, amount: ops, scored: true, stonewalled: None }
    }

    /// IO500's line: `[RESULT]       ior-easy-write      811.333074 GiB/s : time 455.060 seconds`.
    pub fn line(&self) -> String {
        let tag = if self.scored { "[RESULT]" } else { "[      ]" };
        let mut s = format!(
            "{tag} {:>20} {:>15.6} {} : time {:.3} seconds",
            self.name,
            self.value,
            self.unit.as_str(),
            self.seconds
        );
        if self.stonewalled == Some(false) {
            s.push_str(" [size cap before the stonewall]");
        }
        s
    }

    pub fn json(&self) -> Value {
        json!({
            "phase": self.name,
            "value": self.value,
            "unit": self.unit.as_str(),
            "seconds": self.seconds,
            "amount": self.amount,
            "scored": self.scored,
            "stonewalled": self.stonewalled,
        })
    }
}

/// IO500's score.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Score {
    /// GiB/s: the geometric mean of the scored bandwidth phases.
    pub bandwidth: f64,
    /// kIOPS: the geometric mean of the scored metadata phases.
    pub iops: f64,
    /// √(bandwidth · iops).
    pub total: f64,
}

/// The geometric mean; 0 if any value is 0 (a failed phase scores nothing), NaN for none.
fn geometric_mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    if values.iter().any(|v| *v <= 0.0) {
        return 0.0;
    }
    (values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp()
}

impl Score {
    pub fn of(results: &[PhaseResult]) -> Score {
        let pick =
            |u: Unit| -> Vec<f64> { results.iter().filter(|r| r.scored && r.unit == u).map(|r| r.value).collect() };
        let bandwidth = geometric_mean(&pick(Unit::GiBs));
        let iops = geometric_mean(&pick(Unit::KIops));
        Score { bandwidth, iops, total: (bandwidth * iops).sqrt() }
    }

    pub fn line(&self) -> String {
        format!(
            "[SCORE ] Bandwidth {:.6} GiB/s : IOPS {:.6} kiops : TOTAL {:.6}",
            self.bandwidth, self.iops, self.total
        )
    }

    pub fn json(&self) -> Value {
        json!({ "bandwidth_gib_s": self.bandwidth, "iops_kiops": self.iops, "total": self.total })
    }
}

/// One run of a comparison: its name, its phases and its score.
pub type Run<'a> = (&'a str, &'a [PhaseResult], &'a Score);

/// The ratio `a / b` (0 when `b` is not positive: nothing to compare with).
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// Runs side by side: a text table (a line per phase of the first run, in its order, with
/// every run's figure, then the ratio of each pair `(a, b)` as `a/b`; last the bandwidth,
/// metadata and total scores) and the same as JSON: `phases` (phase → run → figure),
/// `scores` (run → score) and `ratios` (`a/b` → phase, `bandwidth`, `md` and `score` →
/// ratio). A phase a run lacks counts 0; a score of a kind no phase ran has no ratio
/// (`-`, null).
pub fn compare(runs: &[Run<'_>], pairs: &[(&str, &str)]) -> (String, Value) {
    use std::fmt::Write;
    let value = |run: &str, phase: &str| {
        runs.iter().find(|r| r.0 == run).and_then(|r| r.1.iter().find(|p| p.name == phase)).map_or(0.0, |p| p.value)
    };
    let score = |run: &str| runs.iter().find(|r| r.0 == run).map(|r| *r.2);
    let mut text = format!("{:22}", "phase");
    for (name, ..) in runs {
        let _ = write!(text, "{name:>14}");
    }
    for (a, b) in pairs {
        let _ = write!(text, "{:>16}", format!("{a}/{b}"));
    }
    text.push('\n');
    let (mut phases, mut ratios) = (serde_json::Map::new(), serde_json::Map::new());
    let first = runs.first().map_or(&[][..], |r| r.1);
    for p in first {
        let _ = write!(text, "{:22}", p.name);
        let mut fig = serde_json::Map::new();
        for (name, ..) in runs {
            let v = value(name, p.name);
            let _ = write!(text, "{v:>14.3}");
            fig.insert((*name).to_string(), json!(v));
        }
        for (a, b) in pairs {
            let r = ratio(value(a, p.name), value(b, p.name));
            let _ = write!(text, "{r:>16.3}");
            let e = ratios.entry(format!("{a}/{b}")).or_insert_with(|| json!({}));
            e[p.name] = json!(r);
        }
        let _ = writeln!(text, " {}", p.unit.as_str());
        phases.insert(p.name.to_string(), Value::Object(fig));
    }
    // The scores: bandwidth, metadata, total (NaN where no phase of the kind ran).
    let mut scores = serde_json::Map::new();
    for (name, _, s) in runs {
        scores.insert((*name).to_string(), s.json());
    }
    let figure = |x: f64| if x.is_finite() { format!("{x:.3}") } else { "-".to_string() };
    for (row, key, of) in [
        ("BW (GiB/s)", "bandwidth", (|s: &Score| s.bandwidth) as fn(&Score) -> f64),
        ("MD (kIOPS)", "md", |s: &Score| s.iops),
        ("SCORE", "score", |s: &Score| s.total),
    ] {
        let _ = write!(text, "{row:22}");
        for (_, _, s) in runs {
            let _ = write!(text, "{:>14}", figure(of(s)));
        }
        for (a, b) in pairs {
            let (x, y) = (score(a).map_or(f64::NAN, |s| of(&s)), score(b).map_or(f64::NAN, |s| of(&s)));
            let r = if x.is_finite() && y.is_finite() { Some(ratio(x, y)) } else { None };
            let _ = write!(text, "{:>16}", r.map_or("-".to_string(), |r| format!("{r:.3}")));
            let e = ratios.entry(format!("{a}/{b}")).or_insert_with(|| json!({}));
            e[key] = json!(r);
        }
        text.push('\n');
    }
    (text, json!({ "phases": phases, "scores": scores, "ratios": ratios }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(name: &'static str, unit: Unit, value: f64, scored: bool) -> PhaseResult {
        PhaseResult { name, unit, value, seconds: 1.0, amount: 0, scored, stonewalled: None }
    }

    /// The Helma run of the ISC25 list (seed 000): its published phases give its published
    /// score, and the unscored ior-rnd4K-easy-read does not move it.
    #[test]
    fn the_score_of_the_published_helma_run() {
        use Unit::*;
        let r = [
            phase("ior-easy-write", GiBs, 811.333074, true),
            phase("mdtest-easy-write", KIops, 1819.160034, true),
            phase("ior-hard-write", GiBs, 60.521807, true),
            phase("mdtest-hard-write", KIops, 387.630357, true),
            phase("find", KIops, 3016.995633, true),
            phase("ior-easy-read", GiBs, 1798.770433, true),
            phase("mdtest-easy-stat", KIops, 8221.826113, true),
            phase("ior-hard-read", GiBs, 419.039776, true),
            phase("mdtest-hard-stat", KIops, 3358.073167, true),
            phase("mdtest-easy-delete", KIops, 1420.241286, true),
            phase("mdtest-hard-read", KIops, 2236.327682, true),
            phase("mdtest-hard-delete", KIops, 235.844820, true),
            phase("ior-rnd4K-easy-read", GiBs, 87.658845, false),
        ];
        let s = Score::of(&r);
        // The published figures are rounded to 6 decimals, from unrounded phases.
        assert!((s.bandwidth - 438.617055).abs() < 2e-6, "{}", s.bandwidth);
        assert!((s.iops - 1604.836213).abs() < 2e-6, "{}", s.iops);
        assert!((s.total - 838.992571).abs() < 2e-6, "{}", s.total);
        assert_eq!(
            s.line(),
            "[SCORE ] Bandwidth 438.617054 GiB/s : IOPS 1604.836213 kiops : TOTAL 838.992570",
            "the published phases, rounded, land within a unit of the last decimal"
        );
        assert_eq!(r[0].line(), "[RESULT]       ior-easy-write      811.333074 GiB/s : time 1.000 seconds");
        assert!(r[12].line().starts_with("[      ]  ior-rnd4K-easy-read"));
    }

    #[test]
    fn a_failed_phase_scores_zero() {
        let r =
            [phase("a", Unit::GiBs, 2.0, true), phase("b", Unit::GiBs, 0.0, true), phase("c", Unit::KIops, 4.0, true)];
        let s = Score::of(&r);
        assert_eq!(s.bandwidth, 0.0);
        assert_eq!(s.iops, 4.0);
        assert_eq!(s.total, 0.0);
    }

    #[test]
    fn runs_side_by_side_with_the_ratios_of_each_pair() {
        let a = [phase("ior-easy-write", Unit::GiBs, 2.0, true), phase("find", Unit::KIops, 10.0, true)];
        let b = [phase("ior-easy-write", Unit::GiBs, 4.0, true), phase("find", Unit::KIops, 5.0, true)];
        let c = [phase("find", Unit::KIops, 0.0, true)];
        let (sa, sb, sc) = (Score::of(&a), Score::of(&b), Score::of(&c));
        let (text, j) = compare(
            &[("nacre", &a, &sa), ("local", &b, &sb), ("broken", &c, &sc)],
            &[("nacre", "local"), ("nacre", "broken")],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6, "{text}");
        assert!(lines[0].contains("nacre/local") && lines[0].contains("nacre/broken"), "{text}");
        assert!(
            lines[1].starts_with("ior-easy-write") && lines[1].contains("0.500") && lines[1].ends_with("GiB/s"),
            "{text}"
        );
        assert!(lines[2].starts_with("find") && lines[2].contains("2.000"), "{text}");
        assert!(lines[3].starts_with("BW (GiB/s)") && lines[4].starts_with("MD (kIOPS)"), "{text}");
        assert!(lines[5].starts_with("SCORE"), "{text}");
        // Without metadata phases there is no metadata score, and no ratio of it.
        let only_bw = [phase("ior-easy-write", Unit::GiBs, 2.0, true)];
        let sb = Score::of(&only_bw);
        let (bw_text, bw) = compare(&[("x", &only_bw, &sb), ("y", &only_bw, &sb)], &[("x", "y")]);
        assert!(bw_text.lines().nth(3).unwrap().ends_with('-'), "{bw_text}");
        assert_eq!(bw["ratios"]["x/y"]["md"], Value::Null);
        assert_eq!(bw["ratios"]["x/y"]["bandwidth"], json!(1.0));
        assert_eq!(j["phases"]["find"]["local"], json!(5.0));
        assert_eq!(j["phases"]["ior-easy-write"]["broken"], json!(0.0), "a phase a run lacks counts 0");
        let r = &j["ratios"]["nacre/local"];
        assert_eq!((r["ior-easy-write"].as_f64(), r["find"].as_f64()), (Some(0.5), Some(2.0)));
        let near = |k: &str, want: f64| (r[k].as_f64().unwrap() - want).abs() < 1e-12;
        assert!(near("bandwidth", 0.5) && near("md", 2.0) && near("score", 1.0), "geometric means: {r}");
        assert_eq!(j["ratios"]["nacre/broken"]["find"], json!(0.0), "nothing to compare with");
        assert_eq!(j["scores"]["local"]["bandwidth_gib_s"], json!(4.0));
    }

    #[test]
    fn bandwidth_and_rate_units() {
        let b = PhaseResult::bandwidth("ior-easy-write", 3 << 30, 2.0);
        assert_eq!(b.value, 1.5);
        let r = PhaseResult::rate("find", 5000, 2.0);
        assert_eq!(r.value, 2.5);
    }
}
