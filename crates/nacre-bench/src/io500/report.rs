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
#[derive(Debug, Clone, Copy, PartialEq)]
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
    fn bandwidth_and_rate_units() {
        let b = PhaseResult::bandwidth("ior-easy-write", 3 << 30, 2.0);
        assert_eq!(b.value, 1.5);
        let r = PhaseResult::rate("find", 5000, 2.0);
        assert_eq!(r.value, 2.5);
    }
}
