//! The client's tunables, under Lustre's names: `osc.*` for the link to each OST,
//! `llite.*` for the mount as a whole. They can be changed while mounted
//! ([`crate::FileSystem::set_param`]), and `set-param -P` values from the MGS are applied
//! at mount and whenever they change.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::Semaphore;

/// A page, as Lustre counts `max_pages_per_rpc`.
pub const PAGE: u64 = 4096;
/// The largest RPC the client sends: 16 MiB, an OSS's largest `brw_size`.
pub const RPC_BYTES_MAX: u64 = 16 << 20;

/// Starting values of the tunables.
#[derive(Debug, Clone)]
pub struct Tunables {
    /// Pages per bulk RPC to an OST (`osc.*.max_pages_per_rpc`): 1,024 pages are 4 MiB.
    pub max_pages_per_rpc: u64,
    /// RPCs in flight to each OST (`osc.*.max_rpcs_in_flight`).
    pub max_rpcs_in_flight: u64,
    /// Bytes written but not yet sent, over the whole mount (`llite.*.max_dirty_mb`). By
    /// default an eighth of the machine's memory, between 64 MiB and 2 GiB: room for
    /// writers some way apart in one file (ior-hard's tasks) to meet before their bytes
    /// go out.
    pub max_dirty_mb: u64,
    /// Read-ahead buffers over the whole mount (`llite.*.max_read_ahead_mb`).
    pub max_read_ahead_mb: u64,
    /// Read-ahead window of one open file (`llite.*.max_read_ahead_per_file_mb`).
    pub max_read_ahead_per_file_mb: u64,
    /// CRC-32C of every bulk RPC, checked by the OSS on writes and here on reads
    /// (`osc.*.checksums`).
    pub checksums: bool,
    /// Names fetched ahead of a numbered sequence of lookups, at most
    /// (`llite.*.statahead_max`; 0 turns statahead off): see the `statahead` module.
    pub statahead_max: u64,
}

impl Default for Tunables {
    fn default() -> Tunables {
        Tunables {
            max_pages_per_rpc: 1024,
            max_rpcs_in_flight: 8,
            max_dirty_mb: default_dirty_mb(),
            max_read_ahead_mb: 256,
            max_read_ahead_per_file_mb: 64,
            checksums: true,
            statahead_max: 128,
        }
    }
}

/// The largest `statahead_max`, as Lustre's.
pub const STATAHEAD_MAX: u64 = 8192;

/// An eighth of this machine's memory in MiB, within [64, 2048].
fn default_dirty_mb() -> u64 {
    // SAFETY: sysinfo fills the struct it is given and touches nothing else.
    let ram = unsafe {
        let mut i: libc::sysinfo = std::mem::zeroed();
        if libc::sysinfo(&mut i) == 0 { (i.totalram as u64).saturating_mul(u64::from(i.mem_unit)) } else { 0 }
    };
    ((ram / 8) >> 20).clamp(64, 2048)
}

/// A byte or slot budget that can be resized while tasks hold parts of it. A shrink that
/// finds the room held is a debt: permits coming back pay it before anyone takes them,
/// and a later grow cancels it first.
pub struct Budget {
    sem: Arc<Semaphore>,
    size: AtomicU64,
    /// Permits still to take out of circulation (a shrink not yet paid).
    debt: std::sync::Mutex<u64>,
}

impl Budget {
    pub fn new(size: u64) -> Budget {
        Budget {
            sem: Arc::new(Semaphore::new(size.min(Semaphore::MAX_PERMITS as u64) as usize)),
            size: AtomicU64::new(size),
            debt: std::sync::Mutex::new(0),
        }
    }

    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    pub fn semaphore(&self) -> &Arc<Semaphore> {
        &self.sem
    }

    /// Pay what can be paid of a shrink's debt from the free permits.
    fn pay(&self) {
        let mut debt = self.debt.lock().unwrap_or_else(|e| e.into_inner());
        while *debt > 0 {
            let n = (*debt).min(self.sem.available_permits() as u64).min(u32::MAX as u64) as u32;
            if n == 0 {
                break;
            }
            match self.sem.try_acquire_many(n) {
                Ok(p) => {
                    p.forget();
                    *debt -= u64::from(n);
                }
                Err(_) => break,
            }
        }
    }

    /// Take `n` (clamped to the whole budget, so one large request cannot wait forever).
    pub async fn take(&self, n: u64) -> tokio::sync::OwnedSemaphorePermit {
        self.pay();
        let n = n.min(self.size()).clamp(1, u32::MAX as u64) as u32;
        // The semaphore is never closed.
        self.sem.clone().acquire_many_owned(n).await.expect("budget semaphore closed")
    }

    /// Take `n` now or not at all.
    pub fn try_take(&self, n: u64) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.pay();
        let n = u32::try_from(n).ok()?;
        self.sem.clone().try_acquire_many_owned(n).ok()
    }

    /// Grow or shrink the budget; a shrink takes effect as holders give back.
    pub fn set(&self, size: u64) {
        let mut debt = self.debt.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.size.swap(size, Ordering::Relaxed);
        if size > old {
            let grow = size - old;
            let cancel = grow.min(*debt);
            *debt -= cancel;
            let add = (grow - cancel).min((Semaphore::MAX_PERMITS - self.sem.available_permits()) as u64);
            self.sem.add_permits(add as usize);
        } else {
            *debt += old - size;
            drop(debt);
            self.pay();
        }
    }
}

/// The tunables of a mount, live.
pub struct Params {
    pub max_pages_per_rpc: AtomicU64,
    pub rpcs_in_flight: AtomicU64,
    pub dirty: Budget,
    pub read_ahead: Budget,
    pub read_ahead_per_file: AtomicU64,
    pub checksums: AtomicBool,
    pub statahead_max: AtomicU64,
}

impl Params {
    pub fn new(t: &Tunables) -> Params {
        Params {
            max_pages_per_rpc: AtomicU64::new(t.max_pages_per_rpc),
            rpcs_in_flight: AtomicU64::new(t.max_rpcs_in_flight),
            dirty: Budget::new(t.max_dirty_mb << 20),
            read_ahead: Budget::new(t.max_read_ahead_mb << 20),
            read_ahead_per_file: AtomicU64::new(t.max_read_ahead_per_file_mb << 20),
            checksums: AtomicBool::new(t.checksums),
            statahead_max: AtomicU64::new(t.statahead_max.min(STATAHEAD_MAX)),
        }
    }

    /// Bytes in one bulk RPC.
    pub fn rpc_bytes(&self) -> u64 {
        (self.max_pages_per_rpc.load(Ordering::Relaxed) * PAGE).min(RPC_BYTES_MAX)
    }

    pub fn checksums(&self) -> bool {
        self.checksums.load(Ordering::Relaxed)
    }

    /// Check and set the tunable `knob` (the last part of a parameter's name).
    pub fn set(&self, knob: &str, value: &str) -> Result<(), String> {
        let number = |lo: u64, hi: u64| -> Result<u64, String> {
            let v: u64 = value.trim().parse().map_err(|_| format!("{knob}={value}: not a number"))?;
            if !(lo..=hi).contains(&v) {
                return Err(format!("{knob}={v}: must be {lo}..={hi}"));
            }
            Ok(v)
        };
        match knob {
            "max_pages_per_rpc" => {
                let v = number(1, RPC_BYTES_MAX / PAGE)?;
                self.max_pages_per_rpc.store(v, Ordering::Relaxed);
            }
            "max_rpcs_in_flight" => {
                let v = number(1, 256)?;
                self.rpcs_in_flight.store(v, Ordering::Relaxed);
            }
            "max_dirty_mb" => self.dirty.set(number(1, 1 << 20)? << 20),
            "max_read_ahead_mb" => self.read_ahead.set(number(0, 1 << 20)? << 20),
            "max_read_ahead_per_file_mb" => {
                let v = number(0, 1 << 20)?;
                self.read_ahead_per_file.store(v << 20, Ordering::Relaxed);
            }
            "checksums" => {
                let v = number(0, 1)?;
                self.checksums.store(v == 1, Ordering::Relaxed);
            }
            "statahead_max" => self.statahead_max.store(number(0, STATAHEAD_MAX)?, Ordering::Relaxed),
            "short_io_bytes" => {
                return Err(format!(
                    "short_io_bytes is read-only: every Nacre RPC carries its data inline, up to {} bytes",
                    self.rpc_bytes()
                ));
            }
            _ => return Err(format!("no client tunable {knob:?}")),
        }
        Ok(())
    }

    /// (knob, value) of every tunable, `osc` ones first.
    pub fn list(&self) -> Vec<(&'static str, &'static str, String)> {
        vec![
            ("osc", "max_pages_per_rpc", self.max_pages_per_rpc.load(Ordering::Relaxed).to_string()),
            ("osc", "max_rpcs_in_flight", self.rpcs_in_flight.load(Ordering::Relaxed).to_string()),
            ("osc", "checksums", u8::from(self.checksums()).to_string()),
            ("osc", "short_io_bytes", self.rpc_bytes().to_string()),
            ("llite", "max_dirty_mb", (self.dirty.size() >> 20).to_string()),
            ("llite", "max_read_ahead_mb", (self.read_ahead.size() >> 20).to_string()),
            (
                "llite",
                "max_read_ahead_per_file_mb",
                (self.read_ahead_per_file.load(Ordering::Relaxed) >> 20).to_string(),
            ),
            ("llite", "statahead_max", self.statahead_max.load(Ordering::Relaxed).to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_shrink_while_held_is_paid_as_permits_come_back_and_a_grow_cancels_it() {
        let b = Budget::new(10);
        let held = b.try_take(8).unwrap();
        b.set(2);
        assert_eq!(b.size(), 2);
        assert!(b.try_take(1).is_none(), "the 2 free permits went to the debt");
        drop(held);
        let one = b.try_take(1).unwrap();
        assert!(b.try_take(2).is_none(), "2 of 2: one held, one free");
        drop(one);
        b.set(10);
        let all = b.try_take(10).unwrap();
        assert!(b.try_take(1).is_none());
        drop(all);
        // Shrink, then grow back before anything came back: no capacity is lost.
        let held = b.try_take(10).unwrap();
        b.set(1);
        b.set(10);
        drop(held);
        assert!(b.try_take(10).is_some(), "a grow cancels the debt");
    }
}
