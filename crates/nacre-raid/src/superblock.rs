//! The superblock: what makes a drive self-describing.
//!
//! Every drive carries two copies of a 4 KiB superblock at offsets 0 and 4096 (a torn
//! write of one leaves the other), a lease block at 8 KiB, then the write-intent bitmap
//! from 64 KiB, then data from 1 MiB. The byte layout is in `docs/formats/raid-superblock.md`; any change to it
//! bumps [`SB_VERSION`]. The newest generation among a volume's drives is authoritative;
//! its slot table says which drive (by tag) is current in each slot and in what state.

use crate::geometry::{DRIVES_MAX, Geometry, Level};

pub const SB_MAGIC: &[u8; 8] = b"NACRERD\0";
pub const SB_VERSION: u32 = 1;
pub const SB_BYTES: usize = 4096;
/// Offsets of the two superblock copies.
pub const SB_OFFSETS: [u64; 2] = [0, 4096];
/// The lease block of multi-mount protection (see [`crate::lease`]): left alone when a
/// volume is made or a drive replaced, as a node holds it before it makes the volume.
pub const LEASE_OFFSET: u64 = 8 << 10;
pub const LEASE_BYTES: usize = 4096;
/// An operator's move request to the lease's holder (see [`crate::lease`]), left alone
/// as the lease is.
pub const MOVE_OFFSET: u64 = LEASE_OFFSET + LEASE_BYTES as u64;
pub const MOVE_BYTES: usize = 4096;
/// Reserved, zeroed at creation, up to the bitmap.
pub const RESERVED_OFFSET: u64 = MOVE_OFFSET + MOVE_BYTES as u64;
/// Where the write-intent bitmap starts, and the most it may occupy.
pub const WIL_OFFSET: u64 = 64 << 10;
pub const WIL_BYTES_MAX: u64 = (1 << 20) - WIL_OFFSET;
/// Where data starts on every drive.
pub const DATA_OFFSET: u64 = 1 << 20;
pub const NAME_BYTES_MAX: usize = 63;
/// No rebuild in progress.
pub const NO_SLOT: u16 = u16::MAX;

const SLOT_TABLE: usize = 256;
const SLOT_ENTRY: usize = 8;
const CRC_AT: usize = SB_BYTES - 4;

/// State of a drive slot, as recorded in the authoritative superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    Online,
    /// Failed or removed; its data is reconstructed from the others.
    Failed,
    /// A replacement being rebuilt: written to, read only below the rebuild checkpoint.
    Rebuilding,
}

impl SlotState {
    fn code(self) -> u8 {
        match self {
            SlotState::Online => 1,
            SlotState::Failed => 2,
            SlotState::Rebuilding => 3,
        }
    }

    fn from_code(c: u8) -> Option<SlotState> {
        match c {
            1 => Some(SlotState::Online),
            2 => Some(SlotState::Failed),
            3 => Some(SlotState::Rebuilding),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SlotState::Online => "online",
            SlotState::Failed => "failed",
            SlotState::Rebuilding => "rebuilding",
        }
    }
}

/// One slot of the drive table: which drive (by its random tag) and its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotEntry {
    pub tag: u32,
    pub state: SlotState,
}

/// The decoded superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub volume_uuid: [u8; 16],
    pub name: String,
    pub level: Level,
    pub k: u16,
    pub m: u16,
    pub groups: u16,
    pub drive_count: u16,
    pub strip_bytes: u32,
    pub rows: u64,
    pub data_offset: u64,
    pub wil_offset: u64,
    pub wil_region_stripes: u64,
    pub wil_bits: u64,
    pub generation: u64,
    /// Set on a clean shutdown; a volume opened without it resyncs its dirty regions.
    pub clean: bool,
    /// Share of bandwidth a rebuild may take while foreground IO runs, 1..=100.
    pub recon_prio: u8,
    /// This drive's slot and tag.
    pub drive_index: u16,
    pub drive_tag: u32,
    pub rebuild_slot: u16,
    /// Rows of `rebuild_slot` already rebuilt.
    pub rebuild_row: u64,
    pub created_unix: u64,
    pub slots: Vec<SlotEntry>,
}

/// Why bytes are not a valid superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SbDecodeError {
    /// Not ours at all (no magic): an empty or foreign drive.
    NoMagic,
    Corrupt(String),
}

fn put<const N: usize>(b: &mut [u8], at: usize, v: [u8; N]) {
    b[at..at + N].copy_from_slice(&v);
}

fn get<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

impl Superblock {
    pub fn geometry(&self) -> Result<Geometry, SbDecodeError> {
        let bad = |r: &str| SbDecodeError::Corrupt(r.to_string());
        let width = self.k as usize + self.m as usize;
        let g = Geometry {
            level: self.level,
            k: self.k as usize,
            m: self.m as usize,
            groups: self.groups as usize,
            strip_bytes: self.strip_bytes as u64,
            rows: self.rows,
        };
        let check = Geometry::new(
            self.level,
            self.drive_count as usize,
            matches!(self.level, Level::Raid10 | Level::Raid50 | Level::Raid60).then_some(width),
            self.strip_bytes as u64,
        )
        .map_err(|e| SbDecodeError::Corrupt(format!("geometry: {e}")))?;
        if (check.k, check.m, check.groups) != (g.k, g.m, g.groups) {
            return Err(bad("geometry fields disagree with the level"));
        }
        Ok(g)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SB_BYTES];
        b[0..8].copy_from_slice(SB_MAGIC);
        put(&mut b, 8, SB_VERSION.to_le_bytes());
        put(&mut b, 12, (SB_BYTES as u32).to_le_bytes());
        put(&mut b, 16, self.volume_uuid);
        let name = self.name.as_bytes();
        b[32..32 + name.len().min(NAME_BYTES_MAX)].copy_from_slice(&name[..name.len().min(NAME_BYTES_MAX)]);
        let (code, n, m) = self.level.code();
        b[96] = code;
        b[97] = n;
        b[98] = m;
        put(&mut b, 100, self.k.to_le_bytes());
        put(&mut b, 102, self.m.to_le_bytes());
        put(&mut b, 104, self.groups.to_le_bytes());
        put(&mut b, 106, self.drive_count.to_le_bytes());
        put(&mut b, 108, self.strip_bytes.to_le_bytes());
        put(&mut b, 112, self.rows.to_le_bytes());
        put(&mut b, 120, self.data_offset.to_le_bytes());
        put(&mut b, 128, self.wil_offset.to_le_bytes());
        put(&mut b, 136, self.wil_region_stripes.to_le_bytes());
        put(&mut b, 144, self.wil_bits.to_le_bytes());
        put(&mut b, 152, self.generation.to_le_bytes());
        b[160] = u8::from(self.clean);
        b[161] = self.recon_prio;
        put(&mut b, 168, self.drive_index.to_le_bytes());
        put(&mut b, 172, self.drive_tag.to_le_bytes());
        put(&mut b, 176, self.rebuild_slot.to_le_bytes());
        put(&mut b, 184, self.rebuild_row.to_le_bytes());
        put(&mut b, 192, self.created_unix.to_le_bytes());
        for (i, s) in self.slots.iter().enumerate() {
            let at = SLOT_TABLE + i * SLOT_ENTRY;
            put(&mut b, at, s.tag.to_le_bytes());
            b[at + 4] = s.state.code();
        }
        let crc = crc32c(&b[..CRC_AT]);
        put(&mut b, CRC_AT, crc.to_le_bytes());
        b
    }

    /// Decode and check one copy. Every field read from the drive is validated here.
    pub fn decode(b: &[u8]) -> Result<Superblock, SbDecodeError> {
        let bad = |r: String| SbDecodeError::Corrupt(r);
        if b.len() < SB_BYTES || &b[0..8] != SB_MAGIC {
            return Err(SbDecodeError::NoMagic);
        }
        let crc = u32::from_le_bytes(get(b, CRC_AT));
        if crc != crc32c(&b[..CRC_AT]) {
            return Err(bad("checksum mismatch".into()));
        }
        let version = u32::from_le_bytes(get(b, 8));
        if version != SB_VERSION {
            return Err(bad(format!("format version {version}, this build reads {SB_VERSION}")));
        }
        let sb_bytes = u32::from_le_bytes(get(b, 12));
        if sb_bytes as usize != SB_BYTES {
            return Err(bad(format!("superblock size {sb_bytes}, expected {SB_BYTES}")));
        }
        let name_raw = &b[32..32 + NAME_BYTES_MAX];
        let name_len = name_raw.iter().position(|&c| c == 0).unwrap_or(NAME_BYTES_MAX);
        let name = std::str::from_utf8(&name_raw[..name_len]).map_err(|_| bad("name is not UTF-8".into()))?.to_string();
        let level =
            Level::from_code(b[96], b[97], b[98]).ok_or_else(|| bad(format!("unknown level code {}", b[96])))?;
        let drive_count = u16::from_le_bytes(get(b, 106));
        if drive_count as usize > DRIVES_MAX || drive_count == 0 {
            return Err(bad(format!("drive count {drive_count}")));
        }
        let mut slots = Vec::with_capacity(drive_count as usize);
        for i in 0..drive_count as usize {
            let at = SLOT_TABLE + i * SLOT_ENTRY;
            let state =
                SlotState::from_code(b[at + 4]).ok_or_else(|| bad(format!("slot {i} has state {}", b[at + 4])))?;
            slots.push(SlotEntry { tag: u32::from_le_bytes(get(b, at)), state });
        }
        let sb = Superblock {
            volume_uuid: get(b, 16),
            name,
            level,
            k: u16::from_le_bytes(get(b, 100)),
            m: u16::from_le_bytes(get(b, 102)),
            groups: u16::from_le_bytes(get(b, 104)),
            drive_count,
            strip_bytes: u32::from_le_bytes(get(b, 108)),
            rows: u64::from_le_bytes(get(b, 112)),
            data_offset: u64::from_le_bytes(get(b, 120)),
            wil_offset: u64::from_le_bytes(get(b, 128)),
            wil_region_stripes: u64::from_le_bytes(get(b, 136)),
            wil_bits: u64::from_le_bytes(get(b, 144)),
            generation: u64::from_le_bytes(get(b, 152)),
            clean: b[160] != 0,
            recon_prio: b[161].clamp(1, 100),
            drive_index: u16::from_le_bytes(get(b, 168)),
            drive_tag: u32::from_le_bytes(get(b, 172)),
            rebuild_slot: u16::from_le_bytes(get(b, 176)),
            rebuild_row: u64::from_le_bytes(get(b, 184)),
            created_unix: u64::from_le_bytes(get(b, 192)),
            slots,
        };
        // Bound every size before any arithmetic on it: a checksum is no authentication.
        // At most 1 PiB per drive keeps every product of sizes below 2^64.
        if sb.rows == 0 || sb.rows > (1 << 50) / sb.strip_bytes.max(1) as u64 {
            return Err(bad(format!("rows {} out of range", sb.rows)));
        }
        if sb.rebuild_row > sb.rows {
            return Err(bad(format!("rebuild checkpoint {} beyond {} rows", sb.rebuild_row, sb.rows)));
        }
        let g = sb.geometry()?;
        if g.drive_count() != drive_count as usize {
            return Err(bad("drive count disagrees with the geometry".into()));
        }
        if sb.drive_index >= drive_count {
            return Err(bad(format!("drive index {} of {drive_count}", sb.drive_index)));
        }
        if sb.data_offset != DATA_OFFSET || sb.wil_offset != WIL_OFFSET {
            return Err(bad("unexpected data or bitmap offset".into()));
        }
        if sb.wil_region_stripes == 0
            || sb.wil_bits.div_ceil(8) > WIL_BYTES_MAX
            || sb.wil_bits != g.stripes().div_ceil(sb.wil_region_stripes)
        {
            return Err(bad("write-intent bitmap geometry is inconsistent".into()));
        }
        if sb.rebuild_slot != NO_SLOT && sb.rebuild_slot >= drive_count {
            return Err(bad(format!("rebuild slot {}", sb.rebuild_slot)));
        }
        Ok(sb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            volume_uuid: [7; 16],
            name: "ost0".into(),
            level: Level::Raid6,
            k: 8,
            m: 2,
            groups: 1,
            drive_count: 10,
            strip_bytes: 128 << 10,
            rows: 100,
            data_offset: DATA_OFFSET,
            wil_offset: WIL_OFFSET,
            wil_region_stripes: 16,
            wil_bits: 7,
            generation: 3,
            clean: true,
            recon_prio: 30,
            drive_index: 4,
            drive_tag: 0xabcd,
            rebuild_slot: NO_SLOT,
            rebuild_row: 0,
            created_unix: 1,
            slots: (0..10).map(|i| SlotEntry { tag: i, state: SlotState::Online }).collect(),
        }
    }

    #[test]
    fn round_trip_and_checksum() {
        let sb = sample();
        let mut bytes = sb.encode();
        assert_eq!(Superblock::decode(&bytes).unwrap(), sb);
        bytes[200] ^= 1;
        assert!(matches!(Superblock::decode(&bytes), Err(SbDecodeError::Corrupt(_))));
        assert_eq!(Superblock::decode(&[0u8; SB_BYTES]), Err(SbDecodeError::NoMagic));
    }

    /// Random damage with a valid checksum (what a buggy or hostile writer could leave)
    /// must decode to an error or to a superblock whose sizes are all within bounds; it
    /// must never panic.
    #[test]
    fn damaged_superblocks_never_panic() {
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(7, |d| d.as_nanos() as u64);
        eprintln!("damaged_superblocks_never_panic: seed {seed}");
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let good = sample().encode();
        for _ in 0..20_000 {
            let mut b = good.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() % CRC_AT as u64) as usize;
                b[at] = next() as u8;
            }
            let crc = crc32c(&b[..CRC_AT]);
            b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
            if let Ok(sb) = Superblock::decode(&b) {
                let g = sb.geometry().expect("a decoded superblock has a valid geometry");
                assert!(g.capacity() > 0 && sb.rebuild_row <= sb.rows);
                assert!((sb.drive_index as usize) < sb.slots.len());
            }
        }
    }

    #[test]
    fn inconsistent_fields_are_refused() {
        let mut sb = sample();
        sb.k = 7;
        assert!(matches!(Superblock::decode(&sb.encode()), Err(SbDecodeError::Corrupt(_))));
        let mut sb = sample();
        sb.drive_index = 10;
        assert!(matches!(Superblock::decode(&sb.encode()), Err(SbDecodeError::Corrupt(_))));
    }
}
