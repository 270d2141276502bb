//! The write pattern of the crash test, shared by the writer (`nacre raid torture`, which
//! is killed with SIGKILL in the middle of it) and the checker (the test, which replays the
//! same pattern from the seed to know what every acknowledged write put where).
//!
//! Thread `t` of `threads` owns the slice `[t * len / threads, (t + 1) * len / threads)` of
//! the volume, so the last acknowledged write of each thread fully defines its bytes, and
//! at most one unacknowledged write per thread may have landed in part.

/// SplitMix64, seeded per (seed, thread, sequence number).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The slice of the volume that thread `t` owns.
pub fn region(capacity: u64, threads: u64, t: u64) -> (u64, u64) {
    let per = capacity / threads;
    (t * per, per)
}

/// Write number `seq` of thread `t`: its offset and bytes. Mixes stripe-aligned,
/// sector-aligned and arbitrary writes of up to three stripes.
pub fn op(seed: u64, capacity: u64, threads: u64, t: u64, seq: u64, stripe: u64) -> (u64, Vec<u8>) {
    let (base, per) = region(capacity, threads, t);
    let mut s = mix(seed ^ mix(t.wrapping_mul(0x1000_0000_01b3) ^ mix(seq)));
    let mut next = || {
        s = mix(s);
        s
    };
    let (off, len) = match next() % 3 {
        0 => {
            let stripes = (per / stripe).max(1);
            let first = next() % stripes;
            let n = 1 + next() % 2.min(stripes - first).max(1);
            (first * stripe, (n * stripe).min(per - first * stripe))
        }
        1 => {
            let sectors = per / 4096;
            let first = next() % sectors;
            (first * 4096, (4096 * (1 + next() % 16)).min(per - first * 4096))
        }
        _ => {
            let off = next() % per;
            (off, (1 + next() % (3 * stripe)).min(per - off))
        }
    };
    let mut data = vec![0u8; len as usize];
    for chunk in data.chunks_mut(8) {
        let v = next().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    (base + off, data)
}

/// The OST crash test's writes: thread `t` writes object `oid` front to back, write `seq`
/// at an offset no other write touches, small (journaled) and large (straight to chunks)
/// in turn, so every acknowledged write alone defines its bytes.
pub fn ost_op(seed: u64, t: u64, seq: u64, chunk: u64) -> (u64, usize) {
    let mut s = mix(seed ^ mix(t.wrapping_mul(0x1000_0000_01b3) ^ mix(seq ^ 0x057)));
    let mut next = || {
        s = mix(s);
        s
    };
    // Each write owns its own slot of 4 chunks: offsets never overlap.
    let slot = seq * 4 * chunk;
    let (lead, len) = match next() % 3 {
        0 => (next() % chunk, 1 + (next() % 40_000) as usize),
        1 => (0, (chunk * (1 + next() % 2)) as usize),
        _ => (next() % chunk, (chunk / 2 + next() % (2 * chunk)) as usize),
    };
    (slot + lead, len)
}

/// The bytes of an OST crash-test write: a function of where they land and the seed.
pub fn ost_bytes(seed: u64, oid: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| (mix(seed ^ (oid << 44) ^ ((offset + i) >> 3)) >> ((offset + i) % 8 * 8)) as u8).collect()
}

/// One operation of the MDT crash test, on names in the thread's own directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MdtOp {
    Create(String),
    Mkdir(String),
    /// Rename within the directory; the target may exist (a file over a file).
    Rename(String, String),
    Unlink(String),
    Rmdir(String),
    Truncate(String, u64),
}

/// What a thread's directory holds: name → (directory?, size). The writer and the checker
/// run the same model from the seed: the writer to pick operations that succeed, the
/// checker to know the directory after any number of acknowledged operations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MdtModel {
    pub entries: std::collections::BTreeMap<String, (bool, u64)>,
}

impl MdtModel {
    /// Operation `k` of thread `t`: always one that succeeds on the current state.
    pub fn next_op(&self, seed: u64, t: u64, k: u64) -> MdtOp {
        let mut s = mix(seed ^ mix(t.wrapping_mul(0x9e37_79b9) ^ mix(k ^ 0x6d64_7400)));
        let mut next = || {
            s = mix(s);
            s
        };
        let r = next();
        if self.entries.len() < 4 || r % 5 == 0 {
            return if r % 7 == 0 { MdtOp::Mkdir(format!("d{k}")) } else { MdtOp::Create(format!("f{k}")) };
        }
        let names: Vec<(&String, &(bool, u64))> = self.entries.iter().collect();
        let (name, &(dir, _)) = names[(next() % names.len() as u64) as usize];
        let choice = next() % 4;
        if dir {
            return if choice < 2 { MdtOp::Rename(name.clone(), format!("d{k}")) } else { MdtOp::Rmdir(name.clone()) };
        }
        match choice {
            0 => {
                // Over another file if there is one, else to a new name.
                let files: Vec<&String> = names.iter().filter(|(n, e)| !e.0 && *n != name).map(|(n, _)| *n).collect();
                let to = if files.is_empty() || next() % 2 == 0 {
                    format!("f{k}")
                } else {
                    files[(next() % files.len() as u64) as usize].clone()
                };
                MdtOp::Rename(name.clone(), to)
            }
            1 => MdtOp::Unlink(name.clone()),
            _ => MdtOp::Truncate(name.clone(), next() % (1 << 40)),
        }
    }

    pub fn apply(&mut self, op: &MdtOp) {
        match op {
            MdtOp::Create(n) => {
                self.entries.insert(n.clone(), (false, 0));
            }
            MdtOp::Mkdir(n) => {
                self.entries.insert(n.clone(), (true, 0));
            }
            MdtOp::Rename(a, b) => {
                if let Some(e) = self.entries.remove(a) {
                    self.entries.insert(b.clone(), e);
                }
            }
            MdtOp::Unlink(n) | MdtOp::Rmdir(n) => {
                self.entries.remove(n);
            }
            MdtOp::Truncate(n, size) => {
                if let Some(e) = self.entries.get_mut(n) {
                    e.1 = *size;
                }
            }
        }
    }

    /// The directory of thread `t` after its first `n` operations.
    pub fn after(seed: u64, t: u64, n: u64) -> MdtModel {
        let mut m = MdtModel::default();
        for k in 0..n {
            let op = m.next_op(seed, t, k);
            m.apply(&op);
        }
        m
    }
}
