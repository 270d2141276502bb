//! Statistics of a service, after Lustre's: `brw_stats` (histograms of bulk IO sizes and
//! times, reads and writes apart) and operation counters per job id (`job_stats`) and per
//! client. The per-job and per-client tables are bounded: past their size the entry seen
//! longest ago goes, as Lustre's `job_cleanup_interval` retires idle jobs.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Entries kept per table (jobs, clients).
pub const ENTRIES_MAX: usize = 4096;

/// A power-of-two histogram: bucket `i` counts values in `[2^i, 2^(i+1))` (bucket 0 also
/// takes 0).
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    pub buckets: Vec<u64>,
}

impl Histogram {
    pub fn add(&mut self, v: u64) {
        let i = if v <= 1 { 0 } else { 63 - v.leading_zeros() as usize };
        if self.buckets.len() <= i {
            self.buckets.resize(i + 1, 0);
        }
        self.buckets[i] += 1;
    }

    pub fn total(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Lustre's layout: value, count, percent, cumulative percent, one line per bucket.
    fn render(&self, out: &mut String, unit: impl Fn(u64) -> String) {
        let total = self.total().max(1);
        let mut cum = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            cum += n;
            let _ = writeln!(out, "{:>8}: {:>10} {:>3} {:>3}", unit(1 << i), n, n * 100 / total, cum * 100 / total);
        }
    }
}

/// Operation counters of one job or client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub read: u64,
    pub read_bytes: u64,
    pub write: u64,
    pub write_bytes: u64,
    pub getattr: u64,
    pub setattr: u64,
    pub punch: u64,
    pub sync: u64,
    pub create: u64,
    pub destroy: u64,
    pub statfs: u64,
}

/// Which operation a request was, for the counters.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    Read(u64),
    Write(u64),
    Getattr,
    Setattr,
    Punch,
    Sync,
    Create,
    Destroy,
    Statfs,
}

impl OpCounts {
    fn add(&mut self, op: Op) {
        match op {
            Op::Read(b) => {
                self.read += 1;
                self.read_bytes += b;
            }
            Op::Write(b) => {
                self.write += 1;
                self.write_bytes += b;
            }
            Op::Getattr => self.getattr += 1,
            Op::Setattr => self.setattr += 1,
            Op::Punch => self.punch += 1,
            Op::Sync => self.sync += 1,
            Op::Create => self.create += 1,
            Op::Destroy => self.destroy += 1,
            Op::Statfs => self.statfs += 1,
        }
    }

    fn render(&self, out: &mut String, indent: &str) {
        let _ = writeln!(out, "{indent}read_bytes:  {{ samples: {}, sum: {} }}", self.read, self.read_bytes);
        let _ = writeln!(out, "{indent}write_bytes: {{ samples: {}, sum: {} }}", self.write, self.write_bytes);
        for (name, n) in [
            ("getattr", self.getattr),
            ("setattr", self.setattr),
            ("punch", self.punch),
            ("sync", self.sync),
            ("create", self.create),
            ("destroy", self.destroy),
            ("statfs", self.statfs),
        ] {
            let _ = writeln!(out, "{indent}{name}: {{ samples: {n} }}");
        }
    }
}

/// A bounded table of counters by key.
#[derive(Default)]
struct Table {
    entries: HashMap<u64, (OpCounts, Instant)>,
}

impl Table {
    fn add(&mut self, key: u64, op: Op, now: Instant) {
        if !self.entries.contains_key(&key) && self.entries.len() >= ENTRIES_MAX {
            // The entry seen longest ago makes room.
            if let Some((&old, _)) = self.entries.iter().min_by_key(|(_, (_, seen))| *seen) {
                self.entries.remove(&old);
            }
        }
        let e = self.entries.entry(key).or_insert_with(|| (OpCounts::default(), now));
        e.0.add(op);
        e.1 = now;
    }
}

#[derive(Default)]
struct Inner {
    read_size: Histogram,
    write_size: Histogram,
    read_time_us: Histogram,
    write_time_us: Histogram,
    jobs: Table,
    clients: Table,
}

/// The statistics of one target.
#[derive(Default)]
pub struct TargetStats {
    inner: Mutex<Inner>,
}

impl TargetStats {
    /// Count one operation by `job` (0: no job id) from `client`, with its bulk IO time.
    pub fn record(&self, job: u64, client: u64, op: Op, took: Duration) {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        match op {
            Op::Read(b) => {
                s.read_size.add(b);
                s.read_time_us.add(us);
            }
            Op::Write(b) => {
                s.write_size.add(b);
                s.write_time_us.add(us);
            }
            _ => {}
        }
        let now = Instant::now();
        s.jobs.add(job, op, now);
        s.clients.add(client, op, now);
    }

    /// `brw_stats` as Lustre prints it (the sections this store has).
    pub fn brw_stats(&self) -> String {
        let s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let size = |b: u64| match b {
            b if b >= 1 << 20 => format!("{}M", b >> 20),
            b if b >= 1 << 10 => format!("{}K", b >> 10),
            b => b.to_string(),
        };
        let time = |us: u64| match us {
            us if us >= 1000 => format!("{}ms", us / 1000),
            us => format!("{us}us"),
        };
        let mut out = String::new();
        for (title, h, unit) in [
            ("read I/O size", &s.read_size, &size as &dyn Fn(u64) -> String),
            ("write I/O size", &s.write_size, &size),
            ("read I/O time", &s.read_time_us, &time),
            ("write I/O time", &s.write_time_us, &time),
        ] {
            let _ = writeln!(out, "{title:<16} {:>10} {:>3} {:>3}", "ios", "%", "cum %");
            h.render(&mut out, unit);
            out.push('\n');
        }
        out
    }

    /// `job_stats` in Lustre's YAML-like form.
    pub fn job_stats(&self) -> String {
        let s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Self::table(&s.jobs, "job_stats", "job_id")
    }

    /// Per-client counters, the same way.
    pub fn client_stats(&self) -> String {
        let s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Self::table(&s.clients, "client_stats", "client")
    }

    fn table(t: &Table, title: &str, key: &str) -> String {
        let mut out = format!("{title}:\n");
        let mut keys: Vec<&u64> = t.entries.keys().collect();
        keys.sort();
        for k in keys {
            let (c, seen) = &t.entries[k];
            let _ = writeln!(out, "- {key}: {k}\n  seconds_since_seen: {}", seen.elapsed().as_secs());
            c.render(&mut out, "  ");
        }
        out
    }

    /// Forget the per-job and per-client counters (`set-param …job_stats=clear`).
    pub fn clear(&self) {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        s.jobs.entries.clear();
        s.clients.entries.clear();
    }

    /// Counters of one job (tests and tools).
    pub fn job(&self, job: u64) -> Option<OpCounts> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).jobs.entries.get(&job).map(|e| e.0.clone())
    }

    pub fn jobs_kept(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).jobs.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_bucket_by_powers_of_two_and_tables_stay_bounded() {
        let s = TargetStats::default();
        for b in [4096u64, 4096, 1 << 20, 47_008] {
            s.record(7, 1, Op::Write(b), Duration::from_micros(300));
        }
        s.record(7, 1, Op::Read(1 << 20), Duration::from_millis(3));
        let brw = s.brw_stats();
        assert!(brw.contains("     32K:          1"), "{brw}");
        assert!(brw.contains("      4K:          2"), "{brw}");
        assert!(brw.contains("     2ms:          1"), "{brw}");
        assert!(brw.contains("   256us:          4"), "{brw}");
        let j = s.job(7).unwrap();
        assert_eq!((j.write, j.write_bytes, j.read), (4, 8192 + (1 << 20) + 47_008, 1));
        for job in 0..(ENTRIES_MAX as u64 + 100) {
            s.record(1000 + job, 2, Op::Getattr, Duration::ZERO);
        }
        assert_eq!(s.jobs_kept(), ENTRIES_MAX, "a client cannot grow the job table");
        assert!(s.job_stats().starts_with("job_stats:\n- job_id: "));
    }
}
