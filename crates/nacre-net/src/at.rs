//! Adaptive timeouts, after Lustre's AT: how long to wait for a reply is learned from how
//! long replies took, within a floor and a ceiling.
//!
//! An [`AtEstimate`] keeps the worst sample of each quarter of the last `at_history`: the
//! estimate is the worst of those four, so one slow reply raises it at once and it decays
//! a quarter-history at a time. A request's deadline is the service estimate plus the
//! network estimate, clamped to `[at_min, at_max]`. The floor is what stopped the obd_ping
//! storms at CEA: with microsecond loopback service times and no floor, every hiccup looks
//! like a dead peer. Time is passed in (milliseconds of a monotonic clock), so tests and a
//! simulator drive it deterministically.

use std::time::Duration;

/// Adaptive-timeout settings, named as Lustre's module parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtConfig {
    /// No deadline shorter than this. Lustre defaults to 0; Nacre to 5 s, CEA's lesson.
    pub at_min: Duration,
    /// No deadline longer than this (Lustre's default, 600 s).
    pub at_max: Duration,
    /// How long a slow sample is remembered (Lustre's default, 600 s).
    pub at_history: Duration,
}

impl Default for AtConfig {
    fn default() -> Self {
        AtConfig {
            at_min: Duration::from_secs(5),
            at_max: Duration::from_secs(600),
            at_history: Duration::from_secs(600),
        }
    }
}

const BINS: usize = 4;

/// The worst sample per quarter of the history window.
#[derive(Debug, Clone)]
pub struct AtEstimate {
    bin_ms: u64,
    bins: [u64; BINS],
    current: usize,
    current_start_ms: u64,
}

impl AtEstimate {
    pub fn new(history: Duration, now_ms: u64) -> AtEstimate {
        AtEstimate {
            bin_ms: (history.as_millis() as u64 / BINS as u64).max(1),
            bins: [0; BINS],
            current: 0,
            current_start_ms: now_ms,
        }
    }

    /// Move the window to `now_ms`, forgetting bins that fell out of the history.
    fn advance(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.current_start_ms);
        let steps = elapsed / self.bin_ms;
        if steps == 0 {
            return;
        }
        for _ in 0..steps.min(BINS as u64) {
            self.current = (self.current + 1) % BINS;
            self.bins[self.current] = 0;
        }
        self.current_start_ms += steps * self.bin_ms;
    }

    /// Record that a reply took `sample`.
    pub fn observe(&mut self, now_ms: u64, sample: Duration) {
        self.advance(now_ms);
        let ms = sample.as_millis().min(u64::MAX as u128) as u64;
        self.bins[self.current] = self.bins[self.current].max(ms);
    }

    /// The worst sample still remembered.
    pub fn estimate(&mut self, now_ms: u64) -> Duration {
        self.advance(now_ms);
        Duration::from_millis(self.bins.iter().copied().max().unwrap_or(0))
    }
}

/// The deadline for a request: service plus network estimate, within `[at_min, at_max]`.
pub fn deadline(cfg: &AtConfig, service: &mut AtEstimate, network: &mut AtEstimate, now_ms: u64) -> Duration {
    let d = service.estimate(now_ms).saturating_add(network.estimate(now_ms));
    d.clamp(cfg.at_min, cfg.at_max.max(cfg.at_min))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1000;

    #[test]
    fn one_slow_reply_raises_the_estimate_and_it_decays_by_quarters() {
        let mut e = AtEstimate::new(Duration::from_secs(600), 0);
        e.observe(10 * S, Duration::from_millis(20));
        e.observe(11 * S, Duration::from_secs(30));
        e.observe(12 * S, Duration::from_millis(50));
        assert_eq!(e.estimate(13 * S), Duration::from_secs(30));
        // Still remembered three quarters later...
        e.observe(160 * S, Duration::from_millis(40));
        assert_eq!(e.estimate(449 * S), Duration::from_secs(30));
        // ...and gone once its quarter leaves the window.
        assert_eq!(e.estimate(601 * S), Duration::from_millis(40));
        assert_eq!(e.estimate(2000 * S), Duration::ZERO);
    }

    #[test]
    fn deadlines_stay_within_the_floor_and_the_ceiling() {
        let cfg = AtConfig::default();
        let mut svc = AtEstimate::new(cfg.at_history, 0);
        let mut net = AtEstimate::new(cfg.at_history, 0);
        svc.observe(1, Duration::from_micros(30));
        assert_eq!(deadline(&cfg, &mut svc, &mut net, 2), cfg.at_min, "fast service: the floor");
        svc.observe(3, Duration::from_secs(20));
        net.observe(3, Duration::from_secs(2));
        assert_eq!(deadline(&cfg, &mut svc, &mut net, 4), Duration::from_secs(22));
        svc.observe(5, Duration::from_secs(5000));
        assert_eq!(deadline(&cfg, &mut svc, &mut net, 6), cfg.at_max, "slow service: the ceiling");
    }
}
