//! Levels and geometry: how a volume's logical bytes map onto strips of drives.
//!
//! Every level is expressed as `groups` erasure groups of `k` data and `m` parity strips
//! per row. RAID0 is one group with `m = 0`; RAID1 is one group with `k = 1` (a mirror is
//! an erasure code whose single data strip is copied `m` times); RAID10 is groups of
//! 1+1; RAID5/6 are one group of k+1 / k+2; RAID50/60 are several; N+M is one group of
//! N+M. One code path then serves every level, and a test of one shape tests them all.
//!
//! Logical layout: data strip `d = offset / strip` belongs to logical stripe `s = d / k`;
//! stripe `s` lives in group `s % groups` at row `s / groups`. Inside a group, parity
//! rotates left-symmetrically (Linux md's default): at row `r` of a group of width
//! `w = k + m`, the first parity strip sits on member `w - 1 - r % w`, parity `j` on the
//! next members after it, and data strip `i` follows the last parity, wrapping around.
//! A sequential read therefore touches every drive in turn.

use std::fmt;
use std::str::FromStr;

use crate::error::{RaidError, Result};

/// Smallest and largest strip, in bytes. 4 KiB is the O_DIRECT sector granule; 1 MiB
/// keeps a full stripe of a 32+4 group under 64 MiB of buffers.
pub const STRIP_MIN_BYTES: u64 = 4096;
pub const STRIP_MAX_BYTES: u64 = 1 << 20;
/// Upper bound on drives per volume: sized so a superblock's drive table fits in 4 KiB.
pub const DRIVES_MAX: usize = 256;
/// Data strips per group: 32 keeps every decode matrix small and the code MDS.
pub const DATA_STRIPS_MAX: usize = 32;
/// Parity strips per group (N+M with M up to 4).
pub const PARITY_STRIPS_MAX: usize = 4;

/// A RAID level as administrators name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Raid0,
    Raid1,
    Raid10,
    Raid5,
    Raid6,
    Raid50,
    Raid60,
    /// Generic erasure code: `n` data and `m` parity strips per stripe.
    Ec {
        n: u8,
        m: u8,
    },
}

impl Level {
    /// The code stored in superblocks.
    pub fn code(self) -> (u8, u8, u8) {
        match self {
            Level::Raid0 => (0, 0, 0),
            Level::Raid1 => (1, 0, 0),
            Level::Raid10 => (10, 0, 0),
            Level::Raid5 => (5, 0, 0),
            Level::Raid6 => (6, 0, 0),
            Level::Raid50 => (50, 0, 0),
            Level::Raid60 => (60, 0, 0),
            Level::Ec { n, m } => (255, n, m),
        }
    }

    pub fn from_code(code: u8, n: u8, m: u8) -> Option<Level> {
        Some(match code {
            0 => Level::Raid0,
            1 => Level::Raid1,
            10 => Level::Raid10,
            5 => Level::Raid5,
            6 => Level::Raid6,
            50 => Level::Raid50,
            60 => Level::Raid60,
            255 => Level::Ec { n, m },
            _ => return None,
        })
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Level::Raid0 => write!(f, "0"),
            Level::Raid1 => write!(f, "1"),
            Level::Raid10 => write!(f, "10"),
            Level::Raid5 => write!(f, "5"),
            Level::Raid6 => write!(f, "6"),
            Level::Raid50 => write!(f, "50"),
            Level::Raid60 => write!(f, "60"),
            Level::Ec { n, m } => write!(f, "{n}+{m}"),
        }
    }
}

impl FromStr for Level {
    type Err = RaidError;

    /// Accepts `0 1 10 5 6 50 60` (optionally prefixed `raid`) and `N+M`.
    fn from_str(s: &str) -> Result<Level> {
        let t = s.trim().to_ascii_lowercase();
        let t = t.strip_prefix("raid").unwrap_or(&t);
        if let Some((n, m)) = t.split_once('+') {
            let bad = || RaidError::BadGeometry(format!("level {s:?}: N+M needs two small integers"));
            let n: u8 = n.trim().parse().map_err(|_| bad())?;
            let m: u8 = m.trim().parse().map_err(|_| bad())?;
            return Ok(Level::Ec { n, m });
        }
        Ok(match t {
            "0" => Level::Raid0,
            "1" => Level::Raid1,
            "10" => Level::Raid10,
            "5" => Level::Raid5,
            "6" => Level::Raid6,
            "50" => Level::Raid50,
            "60" => Level::Raid60,
            _ => {
                return Err(RaidError::BadGeometry(format!("unknown level {s:?} (use 0, 1, 10, 5, 6, 50, 60 or N+M)")));
            }
        })
    }
}

/// The shape of a volume: validated once, then immutable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub level: Level,
    /// Data strips per group row.
    pub k: usize,
    /// Parity (or mirror) strips per group row.
    pub m: usize,
    /// Number of groups striped together (RAID10/50/60), 1 otherwise.
    pub groups: usize,
    pub strip_bytes: u64,
    /// Rows per drive: each drive holds `rows` strips of data or parity.
    pub rows: u64,
}

/// Where one strip lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripLoc {
    /// Drive slot in the volume (0..drive_count).
    pub drive: usize,
    /// Row on that drive.
    pub row: u64,
}

impl Geometry {
    /// Validate a level over `drives` drives with an optional group size (RAID10/50/60).
    pub fn new(level: Level, drives: usize, group_size: Option<usize>, strip_bytes: u64) -> Result<Geometry> {
        if !(STRIP_MIN_BYTES..=STRIP_MAX_BYTES).contains(&strip_bytes) || !strip_bytes.is_power_of_two() {
            return Err(RaidError::BadStripSize(strip_bytes));
        }
        if drives > DRIVES_MAX {
            return Err(RaidError::BadGeometry(format!("{drives} drives; at most {DRIVES_MAX} per volume")));
        }
        let need = |needed: &str| RaidError::NotEnoughDrives { level, needed: needed.to_string(), got: drives };
        let grouped = |min_group: usize, parity: usize, default_group: usize| -> Result<(usize, usize, usize)> {
            let g = group_size.unwrap_or(default_group);
            if g < min_group {
                return Err(RaidError::BadGeometry(format!(
                    "level {level} needs groups of at least {min_group} drives, got group size {g}"
                )));
            }
            if drives < 2 * g || !drives.is_multiple_of(g) {
                return Err(RaidError::NotEnoughDrives {
                    level,
                    needed: format!("a multiple of the group size {g}, at least {}", 2 * g),
                    got: drives,
                });
            }
            Ok((g - parity, parity, drives / g))
        };
        if group_size.is_some() && !matches!(level, Level::Raid10 | Level::Raid50 | Level::Raid60) {
            return Err(RaidError::BadGeometry(format!("level {level} takes no group size (only 10, 50, 60 do)")));
        }
        let (k, m, groups) = match level {
            Level::Raid0 if drives >= 1 => (drives, 0, 1),
            Level::Raid0 => return Err(need("at least 1")),
            Level::Raid1 if drives >= 2 => (1, drives - 1, 1),
            Level::Raid1 => return Err(need("at least 2")),
            Level::Raid5 if drives >= 3 => (drives - 1, 1, 1),
            Level::Raid5 => return Err(need("at least 3")),
            Level::Raid6 if drives >= 4 => (drives - 2, 2, 1),
            Level::Raid6 => return Err(need("at least 4")),
            Level::Raid10 => grouped(2, 1, 2).map(|(_, _, groups)| (1, group_size.unwrap_or(2) - 1, groups))?,
            Level::Raid50 => grouped(3, 1, drives / 2)?,
            Level::Raid60 => grouped(4, 2, drives / 2)?,
            Level::Ec { n, m } => {
                let (n, m) = (n as usize, m as usize);
                if n < 1 || !(1..=PARITY_STRIPS_MAX).contains(&m) {
                    return Err(RaidError::BadGeometry(format!(
                        "level {level}: N must be at least 1 and M between 1 and {PARITY_STRIPS_MAX}"
                    )));
                }
                if drives != n + m {
                    return Err(need(&format!("exactly {}", n + m)));
                }
                (n, m, 1)
            }
        };
        if k > DATA_STRIPS_MAX {
            return Err(RaidError::BadGeometry(format!(
                "{k} data strips per stripe; at most {DATA_STRIPS_MAX} (use RAID50/60 groups)"
            )));
        }
        if m > PARITY_STRIPS_MAX {
            return Err(RaidError::BadGeometry(if k == 1 {
                format!("level {level} keeps at most {} copies of each strip, got {}", PARITY_STRIPS_MAX + 1, m + 1)
            } else {
                format!("{m} parity strips; at most {PARITY_STRIPS_MAX}")
            }));
        }
        Ok(Geometry { level, k, m, groups, strip_bytes, rows: 0 })
    }

    /// Drives per group.
    pub fn width(&self) -> usize {
        self.k + self.m
    }

    pub fn drive_count(&self) -> usize {
        self.width() * self.groups
    }

    /// Bytes of data in one stripe (one row of one group).
    pub fn stripe_data_bytes(&self) -> u64 {
        self.k as u64 * self.strip_bytes
    }

    /// Logical stripes in the volume.
    pub fn stripes(&self) -> u64 {
        self.rows * self.groups as u64
    }

    /// Usable bytes.
    pub fn capacity(&self) -> u64 {
        self.stripes() * self.stripe_data_bytes()
    }

    /// Group and row of a logical stripe.
    pub fn stripe_home(&self, stripe: u64) -> (usize, u64) {
        ((stripe % self.groups as u64) as usize, stripe / self.groups as u64)
    }

    /// Member position (0..width) of shard `shard` (data 0..k, parity k..k+m) at `row`.
    pub fn member(&self, row: u64, shard: usize) -> usize {
        let w = self.width();
        let first_parity = w - 1 - (row % w as u64) as usize;
        if shard >= self.k { (first_parity + (shard - self.k)) % w } else { (first_parity + self.m + shard) % w }
    }

    /// Shard index (data 0..k, parity k..k+m) held by member `member` of a group at `row`.
    pub fn shard_of_member(&self, row: u64, member: usize) -> usize {
        let w = self.width();
        let first_parity = w - 1 - (row % w as u64) as usize;
        let pos = (member + w - first_parity) % w;
        if pos < self.m { self.k + pos } else { pos - self.m }
    }

    /// Drive slot and row holding shard `shard` of logical stripe `stripe`.
    pub fn locate(&self, stripe: u64, shard: usize) -> StripLoc {
        let (group, row) = self.stripe_home(stripe);
        StripLoc { drive: group * self.width() + self.member(row, shard), row }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_symmetric_raid5_matches_md() {
        // md's left-symmetric RAID5 over 4 drives: parity on 3,2,1,0; data starts after it.
        let g = Geometry::new(Level::Raid5, 4, None, 4096).unwrap();
        let rows: Vec<Vec<usize>> = (0..4).map(|r| (0..4).map(|s| g.member(r, s)).collect()).collect();
        assert_eq!(rows[0], vec![0, 1, 2, 3]);
        assert_eq!(rows[1], vec![3, 0, 1, 2]);
        assert_eq!(rows[2], vec![2, 3, 0, 1]);
        assert_eq!(rows[3], vec![1, 2, 3, 0]);
    }

    #[test]
    fn member_and_shard_are_inverse() {
        for (level, n, gs) in
            [(Level::Raid6, 10, None), (Level::Raid60, 12, Some(6)), (Level::Ec { n: 5, m: 3 }, 8, None)]
        {
            let g = Geometry::new(level, n, gs, 65536).unwrap();
            for row in 0..20 {
                let mut seen = vec![false; g.width()];
                for shard in 0..g.width() {
                    let m = g.member(row, shard);
                    assert!(!seen[m], "two shards on one member");
                    seen[m] = true;
                    assert_eq!(g.shard_of_member(row, m), shard);
                }
            }
        }
    }

    #[test]
    fn levels_parse_and_validate() {
        assert_eq!("raid6".parse::<Level>().unwrap(), Level::Raid6);
        assert_eq!("8+2".parse::<Level>().unwrap(), Level::Ec { n: 8, m: 2 });
        assert!("7".parse::<Level>().is_err());
        let g = Geometry::new(Level::Raid10, 4, None, 16384).unwrap();
        assert_eq!((g.k, g.m, g.groups), (1, 1, 2));
        let g = Geometry::new(Level::Raid50, 18, Some(9), 65536).unwrap();
        assert_eq!((g.k, g.m, g.groups), (8, 1, 2));
        assert!(matches!(Geometry::new(Level::Raid6, 3, None, 4096), Err(RaidError::NotEnoughDrives { .. })));
        assert!(matches!(Geometry::new(Level::Raid6, 4, None, 12288), Err(RaidError::BadStripSize(12288))));
        assert!(matches!(Geometry::new(Level::Raid6, 4, None, 2 << 20), Err(RaidError::BadStripSize(_))));
        assert!(Geometry::new(Level::Raid50, 10, Some(4), 4096).is_err());
        assert!(Geometry::new(Level::Ec { n: 8, m: 5 }, 13, None, 4096).is_err());
        assert!(Geometry::new(Level::Raid5, 4, Some(2), 4096).is_err());
        assert!(Geometry::new(Level::Raid1, 5, None, 4096).is_ok());
        let e = Geometry::new(Level::Raid1, 6, None, 4096).unwrap_err().to_string();
        assert!(e.contains("at most 5 copies"), "{e}");
    }
}
