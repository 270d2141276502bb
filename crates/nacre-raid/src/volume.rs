//! Volumes: create, assemble, read, write, fail, replace, rebuild, scrub.
//!
//! A [`Volume`] owns its drives and serves byte-addressed reads and writes. The stripe is
//! the unit of consistency: every write takes the stripe lock, marks the region in the
//! write-intent log, then updates data and parity. Three write plans exist for a stripe:
//!
//! * **full stripe** — parity from the new data alone, no reads;
//! * **read-modify-write** — read the old data of the touched strips and the parity,
//!   apply the difference (`reads = touched + parity`);
//! * **reconstruct-write** — read the untouched data and encode afresh
//!   (`reads = data strips not covered`); when drives are missing the same plan decodes
//!   the missing data first.
//!
//! The planner picks whichever reads less. Faults this module survives: a drive failing
//! in the middle of any IO (the stripe stays consistent on the survivors, because the
//! writes that landed describe the new stripe), up to `m` failed drives per group, and a
//! crash at any point (the write-intent log names the stripes to resync).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::align::{AlignedBuf, BufPool, SECTOR_BYTES, is_aligned};
use crate::drive::BlockDevice;
use crate::ec::Codec;
use crate::error::{RaidError, Result};
use crate::geometry::{Geometry, Level};
use crate::ioq::{DriveQueues, IoBuf, IoFailure, IoReq};
use crate::lock::StripeLocks;
use crate::superblock::{
    DATA_OFFSET, NAME_BYTES_MAX, NO_SLOT, RESERVED_OFFSET, SB_BYTES, SB_OFFSETS, SbDecodeError, SlotEntry, SlotState,
    Superblock, WIL_BYTES_MAX, WIL_OFFSET,
};
use crate::wil::{BitmapWrite, Wil};

/// Default share (percent) of the drive bandwidth a rebuild takes while clients do IO,
/// after xiRAID's `recon_prio`; with no client IO a rebuild runs at full speed. 10 keeps
/// client writes at or above 0.7× healthy in `nacre raid bench` on 2 cores.
pub const RECON_PRIO_DEFAULT: u8 = 10;
/// Logical bytes covered by one write-intent bit, by default. Larger regions mean fewer
/// bitmap writes in steady state but more to resync after a crash.
pub const WIL_REGION_BYTES_DEFAULT: u64 = 64 << 20;
/// How often idle write-intent regions are cleared.
pub const WIL_CLEAN_INTERVAL_DEFAULT: Duration = Duration::from_millis(500);
/// Rebuilt rows between two checkpoints written to the superblocks.
const REBUILD_CHECKPOINT_ROWS: u64 = 256;
/// Data rebuilt per member and step. A step locks its stripes and fills every drive
/// queue, so small steps interleave finely with client IO: measured with three rounds of
/// `nacre raid bench` on /dev/shm, 256 KiB kept client writes at 0.70–0.87× healthy during
/// a rebuild where 1 MiB gave 0.66–0.81×. (Switching to 4 MiB steps when clients go idle
/// was tried and made the busy case worse: 0.55–0.85×.)
const REBUILD_STEP_BYTES: u64 = 256 << 10;
/// Whole stripes of one write sent to the drives as one batch: 8 stripes of 8+2 × 128 KiB
/// keep 80 strip writes in flight for a single writer.
const WRITE_BATCH_STRIPES_MAX: u64 = 8;
/// Degraded stripes of one read decoded together (their reads go out as one batch).
const DEGRADED_BATCH_STRIPES_MAX: usize = 8;
/// Requests gathered into one batch of healthy reads.
const READ_BATCH_REQS_MAX: usize = 64;
/// Aligned buffers kept for reuse, and the bytes they may hold in all.
const POOL_BUFFERS_MAX: usize = 64;
const POOL_BYTES_MAX: usize = 128 << 20;

/// How to create a volume.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    pub name: String,
    pub level: Level,
    /// Drives per group for RAID10/50/60 (default: 2 for RAID10, half the drives for 50/60).
    pub group_size: Option<usize>,
    pub strip_bytes: u64,
    pub wil_region_bytes: u64,
    pub recon_prio: u8,
    /// Overwrite drives that carry another volume's superblock.
    pub force: bool,
    /// The drives are known to hold zeros (fresh files): skip the parity initialization.
    pub assume_clean: bool,
}

impl CreateOptions {
    /// Check everything that does not need the drives: name, level and drive count, strip
    /// size, priority. `Volume::create` calls it too; the CLI calls it before it makes files.
    pub fn validate(&self, drive_count: usize) -> Result<Geometry> {
        validate_name(&self.name)?;
        let geo = Geometry::new(self.level, drive_count, self.group_size, self.strip_bytes)?;
        if !(1..=100).contains(&self.recon_prio) {
            return Err(RaidError::BadGeometry(format!("recon_prio {} is not within 1..=100", self.recon_prio)));
        }
        Ok(geo)
    }

    pub fn new(name: &str, level: Level) -> CreateOptions {
        CreateOptions {
            name: name.to_string(),
            level,
            group_size: None,
            strip_bytes: 128 << 10,
            wil_region_bytes: WIL_REGION_BYTES_DEFAULT,
            recon_prio: RECON_PRIO_DEFAULT,
            force: false,
            assume_clean: false,
        }
    }
}

/// Run-time settings that are not stored on the drives.
#[derive(Debug, Clone)]
pub struct VolumeOptions {
    /// IO threads per drive slot.
    pub threads_per_drive: usize,
    pub wil_clean_interval: Duration,
}

impl Default for VolumeOptions {
    fn default() -> Self {
        VolumeOptions { threads_per_drive: 2, wil_clean_interval: WIL_CLEAN_INTERVAL_DEFAULT }
    }
}

/// The health of a volume as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeState {
    Optimal,
    Degraded,
    Rebuilding,
    Offline,
}

impl VolumeState {
    pub fn name(self) -> &'static str {
        match self {
            VolumeState::Optimal => "online",
            VolumeState::Degraded => "degraded",
            VolumeState::Rebuilding => "rebuilding",
            VolumeState::Offline => "offline",
        }
    }
}

/// One drive slot as `show` prints it.
#[derive(Debug, Clone)]
pub struct DriveStatus {
    pub slot: usize,
    pub group: usize,
    pub path: Option<PathBuf>,
    pub state: SlotState,
}

/// Counters since the volume was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub reads: u64,
    pub writes: u64,
    pub full_stripe_writes: u64,
    pub rmw_writes: u64,
    pub rcw_writes: u64,
    pub degraded_writes: u64,
    pub degraded_reads: u64,
    /// Strip-level requests sent to drives.
    pub drive_reads: u64,
    pub drive_writes: u64,
    /// Strips mended with bytes decoded from the rest of their stripe ([`Volume::repair`]).
    pub repairs: u64,
}

/// A snapshot of a volume for `show`.
#[derive(Debug, Clone)]
pub struct Status {
    pub name: String,
    pub uuid: String,
    pub level: Level,
    pub k: usize,
    pub m: usize,
    pub groups: usize,
    pub strip_bytes: u64,
    pub capacity: u64,
    pub state: VolumeState,
    pub generation: u64,
    pub recon_prio: u8,
    pub drives: Vec<DriveStatus>,
    /// (slot, rows done, rows total)
    pub rebuild: Option<(usize, u64, u64)>,
    /// (stripes done, stripes total) of a running scrub
    pub scrub: Option<(u64, u64)>,
    pub dirty_regions: usize,
    pub wil_region_bytes: u64,
    pub stats: Stats,
}

/// What a scrub found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub stripes_checked: u64,
    /// Stripes whose shards disagreed.
    pub mismatches: u64,
    pub repaired: u64,
    /// Mismatched stripes in which the one bad strip was identified (needs two or more
    /// redundant strips); that strip is what a repair rewrites. Otherwise data is taken
    /// as truth and parity is rewritten.
    pub located: u64,
    /// Stripes that could not be checked (too many drives missing).
    pub unchecked: u64,
}

/// The result of assembling: the volume and the drives that were turned away, each with
/// the reason.
/// Drives matched to the slots of one volume, before it is opened.
struct Selection {
    /// The newest superblock: the volume's authoritative description.
    auth: Superblock,
    slots: Vec<Slot>,
    refused: Vec<RaidError>,
    /// The drives accepted into slots (their bitmaps name the stripes to resync).
    present: Vec<Arc<dyn BlockDevice>>,
}

pub struct Assembled {
    pub volume: Volume,
    pub refused: Vec<RaidError>,
    /// Stripes resynced because the volume was not shut down cleanly.
    pub resynced_stripes: u64,
}

struct Slot {
    drive: Option<Arc<dyn BlockDevice>>,
    tag: u32,
    state: SlotState,
}

struct Meta {
    generation: u64,
    clean: bool,
    recon_prio: u8,
    rebuild_slot: u16,
    /// Rebuild checkpoint as last written to the superblocks.
    rebuild_row: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    full_stripe_writes: AtomicU64,
    rmw_writes: AtomicU64,
    rcw_writes: AtomicU64,
    degraded_writes: AtomicU64,
    degraded_reads: AtomicU64,
    drive_reads: AtomicU64,
    drive_writes: AtomicU64,
    repairs: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

struct Inner {
    name: String,
    uuid: [u8; 16],
    created_unix: u64,
    geo: Geometry,
    codec: Codec,
    wil_region_stripes: u64,
    wil_bits: u64,
    slots: RwLock<Vec<Slot>>,
    meta: Mutex<Meta>,
    /// Rows of the rebuilding slot written so far (ahead of the checkpoint).
    rebuild_row: AtomicU64,
    /// Rows of the rebuilding slot that reads may use: the durable checkpoint only, so
    /// that what a read trusts survives a crash.
    rebuild_readable: AtomicU64,
    locks: StripeLocks,
    wil: Wil,
    queues: DriveQueues,
    pool: BufPool,
    stats: Counters,
    stop: AtomicBool,
    wake: (Mutex<()>, Condvar),
    /// Bytes moved to and from drives for everything but the rebuild: the rebuild
    /// throttle compares its own bytes with these.
    foreground_bytes: AtomicU64,
    scrub_done: AtomicU64,
    scrub_total: AtomicU64,
    rebuild_running: AtomicBool,
    /// The error that failed a drive first (told with the volume going offline: a fenced
    /// node's drives all fail with the reason its lease was lost).
    first_failure: Mutex<Option<String>>,
}

/// A RAID volume over drives. All IO methods take `&self` and may run concurrently.
pub struct Volume {
    inner: Arc<Inner>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    closed: AtomicBool,
}

/// Why one stripe operation did not finish.
enum StripeError {
    /// A read failed before anything was written; the failed drive is now marked and the
    /// stripe can be planned again.
    Retry,
    Fatal(RaidError),
}

impl From<RaidError> for StripeError {
    fn from(e: RaidError) -> Self {
        StripeError::Fatal(e)
    }
}

/// One shard of one stripe as the current slot table sees it.
#[derive(Clone)]
struct ShardView {
    slot: usize,
    drive: Option<Arc<dyn BlockDevice>>,
    readable: bool,
    writable: bool,
}

/// A stripe of a read whose touched strips are not all readable, and the caller's
/// buffer for each touched strip.
struct DegradedStripe<'a> {
    stripe: u64,
    touches: Vec<Touch>,
    dsts: Vec<&'a mut [u8]>,
    /// A shard to decode even though its drive reads (its bytes are known to be wrong).
    distrust: Option<usize>,
}

/// A piece of a data strip touched by an IO: strip-relative byte range `[lo, hi)` and its
/// place in the caller's buffer.
#[derive(Clone, Copy)]
struct Touch {
    shard: usize,
    lo: u64,
    hi: u64,
    user: usize,
}

impl Touch {
    fn slo(&self) -> u64 {
        self.lo / SECTOR_BYTES as u64 * SECTOR_BYTES as u64
    }
    fn shi(&self) -> u64 {
        self.hi.div_ceil(SECTOR_BYTES as u64) * SECTOR_BYTES as u64
    }
    fn len(&self) -> usize {
        (self.hi - self.lo) as usize
    }
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    let filled = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
    if filled.is_err() {
        // No /dev/urandom: fall back to time and address entropy; uniqueness, not secrecy.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let seed = t ^ (&b as *const _ as u128);
        for (i, x) in b.iter_mut().enumerate() {
            *x = (seed >> ((i % 16) * 8)) as u8 ^ (i as u8).wrapping_mul(151);
        }
    }
    b
}

fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
    if ok { Ok(()) } else { Err(RaidError::BadName(name.to_string())) }
}

fn format_uuid(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// Read both superblock copies of a drive and keep the valid one of higher generation.
pub fn read_superblock(drive: &dyn BlockDevice) -> Result<Superblock> {
    let path = drive.path();
    let mut buf = AlignedBuf::zeroed(SB_BYTES);
    let mut best: Option<Superblock> = None;
    let mut corrupt = None;
    let mut any_magic = false;
    for off in SB_OFFSETS {
        if drive.size() < off + SB_BYTES as u64 {
            break;
        }
        drive.read_at(&mut buf, off).map_err(|e| RaidError::io(path, e))?;
        match Superblock::decode(&buf) {
            Ok(sb) => {
                any_magic = true;
                if best.as_ref().is_none_or(|b| sb.generation > b.generation) {
                    best = Some(sb);
                }
            }
            Err(SbDecodeError::NoMagic) => {}
            Err(SbDecodeError::Corrupt(reason)) => {
                any_magic = true;
                corrupt = Some(reason);
            }
        }
    }
    match (best, corrupt, any_magic) {
        (Some(sb), _, _) => Ok(sb),
        (None, Some(reason), _) => Err(RaidError::CorruptSuperblock { path: path.to_path_buf(), reason }),
        _ => Err(RaidError::NoSuperblock { path: path.to_path_buf() }),
    }
}

impl Volume {
    /// Create a volume over `drives` (in slot order). Everything is validated before the
    /// first byte is written; on error the drives are untouched.
    pub fn create(drives: Vec<Arc<dyn BlockDevice>>, opts: &CreateOptions, run: &VolumeOptions) -> Result<Volume> {
        let mut geo = opts.validate(drives.len())?;
        for (i, d) in drives.iter().enumerate() {
            if drives[..i].iter().any(|o| o.path() == d.path()) {
                return Err(RaidError::DuplicateDrive { path: d.path().to_path_buf() });
            }
        }
        let (small, large) = {
            let by_size = |a: &&Arc<dyn BlockDevice>, b: &&Arc<dyn BlockDevice>| a.size().cmp(&b.size());
            (drives.iter().min_by(by_size), drives.iter().max_by(by_size))
        };
        let (Some(small), Some(large)) = (small, large) else {
            return Err(RaidError::NotEnoughDrives { level: opts.level, needed: "at least 1".into(), got: 0 });
        };
        if small.size() != large.size() {
            return Err(RaidError::UnequalDrives {
                small: small.path().to_path_buf(),
                small_size: small.size(),
                large: large.path().to_path_buf(),
                large_size: large.size(),
            });
        }
        let needed = DATA_OFFSET + opts.strip_bytes;
        if small.size() < needed {
            return Err(RaidError::DriveTooSmall { path: small.path().to_path_buf(), size: small.size(), needed });
        }
        if !opts.force {
            for d in &drives {
                match read_superblock(d.as_ref()) {
                    Ok(sb) => return Err(RaidError::DriveInUse { path: d.path().to_path_buf(), volume: sb.name }),
                    Err(RaidError::NoSuperblock { .. }) => {}
                    Err(RaidError::CorruptSuperblock { .. }) => {
                        return Err(RaidError::DriveInUse { path: d.path().to_path_buf(), volume: "(damaged)".into() });
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        geo.rows = (small.size() - DATA_OFFSET) / opts.strip_bytes;
        let mut region_stripes = (opts.wil_region_bytes / geo.stripe_data_bytes()).max(1);
        while geo.stripes().div_ceil(region_stripes).div_ceil(8) > WIL_BYTES_MAX {
            region_stripes *= 2;
        }
        let slots: Vec<SlotEntry> = drives
            .iter()
            .map(|_| SlotEntry { tag: u32::from_le_bytes(random_bytes()), state: SlotState::Online })
            .collect();
        let sb = Superblock {
            volume_uuid: random_bytes(),
            name: opts.name.clone(),
            level: opts.level,
            k: geo.k as u16,
            m: geo.m as u16,
            groups: geo.groups as u16,
            drive_count: drives.len() as u16,
            strip_bytes: opts.strip_bytes as u32,
            rows: geo.rows,
            data_offset: DATA_OFFSET,
            wil_offset: WIL_OFFSET,
            wil_region_stripes: region_stripes,
            wil_bits: geo.stripes().div_ceil(region_stripes),
            generation: 1,
            clean: true,
            recon_prio: opts.recon_prio,
            drive_index: 0,
            drive_tag: 0,
            rebuild_slot: NO_SLOT,
            rebuild_row: 0,
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            slots: slots.clone(),
        };
        // Write the bitmap area, then the superblocks: a drive with a superblock always has
        // a valid bitmap behind it. Drives of unknown contents get every bit set, so that an
        // initialization cut short by a crash is redone in full at the next assembly.
        let mut zeros =
            AlignedBuf::zeroed(sb.wil_bits.div_ceil(8).div_ceil(SECTOR_BYTES as u64) as usize * SECTOR_BYTES);
        if !opts.assume_clean {
            zeros.fill(0xff);
        }
        let reserved = AlignedBuf::zeroed((WIL_OFFSET - RESERVED_OFFSET) as usize);
        for (i, d) in drives.iter().enumerate() {
            d.write_at(&reserved, RESERVED_OFFSET).map_err(|e| RaidError::io(d.path(), e))?;
            d.write_at(&zeros, WIL_OFFSET).map_err(|e| RaidError::io(d.path(), e))?;
            let mut own = sb.clone();
            own.drive_index = i as u16;
            own.drive_tag = slots[i].tag;
            write_sb(d.as_ref(), &own).map_err(|e| RaidError::io(d.path(), e))?;
        }
        let slots = drives
            .into_iter()
            .zip(slots)
            .map(|(d, e)| Slot { drive: Some(d), tag: e.tag, state: SlotState::Online })
            .collect();
        let vol = Volume::open(sb, slots, run)?;
        if !opts.assume_clean {
            // Old contents make parity meaningless: compute it once for the whole volume.
            if let Err(e) = vol.resync(0..vol.inner.geo.stripes(), |_, _| {}) {
                vol.halt_without_cleanup();
                return Err(e);
            }
            vol.inner.clear_whole_bitmap()?;
        }
        Ok(vol)
    }

    /// Read the candidates' superblocks and match drives to the slots of one volume, the
    /// way assembly does, without writing anything.
    fn select(candidates: Vec<Arc<dyn BlockDevice>>, name: Option<&str>) -> Result<Selection> {
        let mut refused = Vec::new();
        let mut found: Vec<(Arc<dyn BlockDevice>, Superblock)> = Vec::new();
        for d in candidates {
            match read_superblock(d.as_ref()) {
                Ok(sb) => found.push((d, sb)),
                Err(RaidError::NoSuperblock { .. }) if name.is_none() => {}
                Err(e) => refused.push(e),
            }
        }
        let mut volumes: Vec<([u8; 16], String)> = Vec::new();
        for (_, sb) in &found {
            if !volumes.iter().any(|(u, _)| *u == sb.volume_uuid) {
                volumes.push((sb.volume_uuid, sb.name.clone()));
            }
        }
        let uuid = match name {
            Some(n) => match volumes.iter().filter(|(_, v)| v == n).collect::<Vec<_>>().as_slice() {
                [(u, _)] => *u,
                [] => return Err(RaidError::NoSuchVolume(n.to_string())),
                many => {
                    let uuids: Vec<String> = many.iter().map(|(u, _)| format_uuid(u)).collect();
                    return Err(RaidError::AmbiguousVolume(format!("'{n}' twice: uuids {}", uuids.join(", "))));
                }
            },
            None => match volumes.as_slice() {
                [(u, _)] => *u,
                [] => return Err(RaidError::NoSuchVolume("(any)".into())),
                many => {
                    let names: Vec<&str> = many.iter().map(|(_, n)| n.as_str()).collect();
                    return Err(RaidError::AmbiguousVolume(names.join(", ")));
                }
            },
        };
        let (mine, others): (Vec<_>, Vec<_>) = found.into_iter().partition(|(_, sb)| sb.volume_uuid == uuid);
        for (d, sb) in others {
            refused.push(RaidError::ForeignDrive {
                path: d.path().to_path_buf(),
                found: sb.name.clone(),
                wanted: name.unwrap_or_default().to_string(),
            });
        }
        let auth = mine
            .iter()
            .map(|(_, sb)| sb)
            .max_by_key(|sb| sb.generation)
            .cloned()
            .ok_or_else(|| RaidError::NoSuchVolume(name.unwrap_or("(any)").to_string()))?;
        let mut slots: Vec<Slot> =
            auth.slots.iter().map(|e| Slot { drive: None, tag: e.tag, state: e.state }).collect();
        let mut dirty_bitmaps: Vec<Arc<dyn BlockDevice>> = Vec::new();
        let needed = DATA_OFFSET + auth.rows * auth.strip_bytes as u64;
        for (d, sb) in mine {
            let idx = sb.drive_index as usize;
            let stale = |reason: String| RaidError::StaleDrive { path: d.path().to_path_buf(), reason };
            let same_shape = (sb.level, sb.k, sb.m, sb.groups, sb.drive_count, sb.strip_bytes, sb.rows)
                == (auth.level, auth.k, auth.m, auth.groups, auth.drive_count, auth.strip_bytes, auth.rows)
                && (sb.wil_region_stripes, sb.wil_bits) == (auth.wil_region_stripes, auth.wil_bits);
            if !same_shape {
                refused.push(RaidError::CorruptSuperblock {
                    path: d.path().to_path_buf(),
                    reason: format!(
                        "its geometry disagrees with the volume's newest superblock (generation {})",
                        auth.generation
                    ),
                });
                continue;
            }
            if d.size() < needed {
                refused.push(RaidError::DriveTooSmall { path: d.path().to_path_buf(), size: d.size(), needed });
                continue;
            }
            let entry = auth.slots[idx];
            if sb.drive_tag != entry.tag {
                refused.push(stale(format!(
                    "it was slot {idx} of '{}' at generation {}, but the slot now holds another drive (generation {})",
                    auth.name, sb.generation, auth.generation
                )));
            } else if entry.state == SlotState::Failed {
                refused.push(stale(format!(
                    "slot {idx} was marked failed; its generation {} is older than the volume's {}; replace it to rebuild",
                    sb.generation, auth.generation
                )));
            } else if slots[idx].drive.is_some() {
                refused.push(RaidError::DuplicateDrive { path: d.path().to_path_buf() });
            } else {
                dirty_bitmaps.push(d.clone());
                slots[idx].drive = Some(d);
            }
        }
        Ok(Selection { auth, slots, refused, present: dirty_bitmaps })
    }

    /// Find a volume among candidate drives and open it. With `name`, drives of other
    /// volumes are refused (and reported); without it, the candidates must hold one volume.
    pub fn assemble(
        candidates: Vec<Arc<dyn BlockDevice>>,
        name: Option<&str>,
        run: &VolumeOptions,
    ) -> Result<Assembled> {
        let Selection { auth, mut slots, refused, present: dirty_bitmaps } = Volume::select(candidates, name)?;
        // Refuse to start a volume that would be offline, before anything is written: a
        // mistyped drive list must not turn present-but-unlisted drives stale.
        let w = (auth.k + auth.m) as usize;
        for (g, group) in slots.chunks(w).enumerate() {
            let usable = group.iter().filter(|s| s.drive.is_some() && s.state == SlotState::Online).count();
            if usable < auth.k as usize {
                let missing: Vec<String> = group
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.drive.is_none() || s.state != SlotState::Online)
                    .map(|(i, s)| {
                        let what = if s.drive.is_none() { "not found" } else { s.state.name() };
                        format!("slot {} {what}", g * w + i)
                    })
                    .collect();
                return Err(RaidError::Offline {
                    volume: auth.name.clone(),
                    reason: format!(
                        "group {g} has {usable} of {} drives it needs ({}); nothing was written",
                        auth.k,
                        missing.join(", ")
                    ),
                });
            }
        }
        for s in &mut slots {
            if s.drive.is_none() && s.state != SlotState::Failed {
                s.state = SlotState::Failed;
            }
        }
        let was_clean = auth.clean;
        let vol = Volume::open(auth, slots, run)?;
        let mut resynced = 0;
        if !was_clean {
            for range in vol.dirty_stripes_on_disk(&dirty_bitmaps) {
                resynced += range.end - range.start;
                if let Err(e) = vol.resync(range, |_, _| {}) {
                    // Leave the volume marked unclean: the next assembly resyncs again.
                    vol.halt_without_cleanup();
                    return Err(e);
                }
            }
            vol.inner.clear_whole_bitmap()?;
        }
        Ok(Assembled { volume: vol, refused, resynced_stripes: resynced })
    }

    /// What `show` prints, read from the superblocks and bitmaps alone: nothing is opened,
    /// written or resynced. Slots whose drive is absent show as failed without a path.
    pub fn inspect(candidates: Vec<Arc<dyn BlockDevice>>, name: Option<&str>) -> Result<(Status, Vec<RaidError>)> {
        let Selection { auth, slots, refused, present } = Volume::select(candidates, name)?;
        let geo = auth
            .geometry()
            .map_err(|e| RaidError::CorruptSuperblock { path: PathBuf::from(&auth.name), reason: format!("{e:?}") })?;
        let drives = drive_statuses(&slots, geo.width());
        let state = volume_state(&drives, geo.width(), geo.m);
        let bitmap_bytes = auth.wil_bits.div_ceil(8).div_ceil(SECTOR_BYTES as u64) as usize * SECTOR_BYTES;
        let mut union = vec![0u8; bitmap_bytes];
        let mut buf = AlignedBuf::zeroed(bitmap_bytes);
        for d in &present {
            if d.read_at(&mut buf, WIL_OFFSET).is_ok() {
                union.iter_mut().zip(buf.iter()).for_each(|(u, b)| *u |= *b);
            }
        }
        let status = Status {
            name: auth.name.clone(),
            uuid: format_uuid(&auth.volume_uuid),
            level: geo.level,
            k: geo.k,
            m: geo.m,
            groups: geo.groups,
            strip_bytes: geo.strip_bytes,
            capacity: geo.capacity(),
            state,
            generation: auth.generation,
            recon_prio: auth.recon_prio,
            drives,
            rebuild: (auth.rebuild_slot != NO_SLOT).then_some((auth.rebuild_slot as usize, auth.rebuild_row, geo.rows)),
            scrub: None,
            dirty_regions: if auth.clean { 0 } else { Wil::set_bits(&union, auth.wil_bits).len() },
            wil_region_bytes: auth.wil_region_stripes * geo.stripe_data_bytes(),
            stats: Stats::default(),
        };
        Ok((status, refused))
    }

    fn open(mut sb: Superblock, slots: Vec<Slot>, run: &VolumeOptions) -> Result<Volume> {
        // A rebuild whose drive is gone cannot resume; its slot is simply failed.
        if sb.rebuild_slot != NO_SLOT
            && slots.get(sb.rebuild_slot as usize).is_none_or(|s| s.state != SlotState::Rebuilding || s.drive.is_none())
        {
            sb.rebuild_slot = NO_SLOT;
            sb.rebuild_row = 0;
        }
        let geo = sb
            .geometry()
            .map_err(|e| RaidError::CorruptSuperblock { path: PathBuf::from(&sb.name), reason: format!("{e:?}") })?;
        let codec = Codec::new(geo.k, geo.m)?;
        let inner = Arc::new(Inner {
            name: sb.name.clone(),
            uuid: sb.volume_uuid,
            created_unix: sb.created_unix,
            geo,
            codec,
            wil_region_stripes: sb.wil_region_stripes,
            wil_bits: sb.wil_bits,
            queues: DriveQueues::new(slots.len(), run.threads_per_drive),
            slots: RwLock::new(slots),
            meta: Mutex::new(Meta {
                generation: sb.generation,
                clean: sb.clean,
                recon_prio: sb.recon_prio,
                rebuild_slot: sb.rebuild_slot,
                rebuild_row: sb.rebuild_row,
            }),
            rebuild_row: AtomicU64::new(sb.rebuild_row),
            rebuild_readable: AtomicU64::new(sb.rebuild_row),
            locks: StripeLocks::new(),
            wil: Wil::new(sb.wil_region_stripes, sb.wil_bits),
            pool: BufPool::new(POOL_BUFFERS_MAX, POOL_BYTES_MAX),
            stats: Counters::default(),
            first_failure: Mutex::new(None),
            stop: AtomicBool::new(false),
            wake: (Mutex::new(()), Condvar::new()),
            foreground_bytes: AtomicU64::new(0),
            scrub_done: AtomicU64::new(0),
            scrub_total: AtomicU64::new(0),
            rebuild_running: AtomicBool::new(false),
        });
        // The volume is open: until a clean close, a crash must trigger a resync.
        inner.persist(|m| m.clean = false)?;
        let vol = Volume { inner, tasks: Mutex::new(Vec::new()), closed: AtomicBool::new(false) };
        vol.spawn_cleaner(run.wil_clean_interval);
        let rebuild_slot = vol.inner.lock_meta().rebuild_slot;
        if rebuild_slot != NO_SLOT {
            vol.start_rebuild(rebuild_slot as usize);
        }
        Ok(vol)
    }

    fn spawn_cleaner(&self, interval: Duration) {
        let inner = self.inner.clone();
        let handle = std::thread::Builder::new()
            .name(format!("raid-wil-{}", inner.name))
            .spawn(move || {
                while !inner.stop.load(Ordering::Acquire) {
                    {
                        let g = inner.wake.0.lock().unwrap_or_else(|e| e.into_inner());
                        let _ = inner.wake.1.wait_timeout(g, interval);
                    }
                    if inner.stop.load(Ordering::Acquire) {
                        break;
                    }
                    // A failed clean pass leaves bits set: safe, only costs resync time.
                    let _ = inner.clean_wil(false);
                }
            })
            .expect("spawn write-intent cleaner");
        self.tasks.lock().unwrap_or_else(|e| e.into_inner()).push(handle);
    }

    /// Usable bytes.
    pub fn capacity(&self) -> u64 {
        self.inner.geo.capacity()
    }

    pub fn geometry(&self) -> Geometry {
        self.inner.geo
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn stats(&self) -> Stats {
        let c = &self.inner.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            reads: l(&c.reads),
            writes: l(&c.writes),
            full_stripe_writes: l(&c.full_stripe_writes),
            rmw_writes: l(&c.rmw_writes),
            rcw_writes: l(&c.rcw_writes),
            degraded_writes: l(&c.degraded_writes),
            degraded_reads: l(&c.degraded_reads),
            drive_reads: l(&c.drive_reads),
            drive_writes: l(&c.drive_writes),
            repairs: l(&c.repairs),
        }
    }

    pub fn status(&self) -> Status {
        let inner = &self.inner;
        let meta = inner.lock_meta();
        let slots = inner.read_slots();
        let drives = drive_statuses(&slots, inner.geo.width());
        let rebuild = (meta.rebuild_slot != NO_SLOT)
            .then(|| (meta.rebuild_slot as usize, inner.rebuild_row.load(Ordering::Acquire), inner.geo.rows));
        let state = volume_state(&drives, inner.geo.width(), inner.geo.m);
        let scrub_total = inner.scrub_total.load(Ordering::Acquire);
        Status {
            name: inner.name.clone(),
            uuid: format_uuid(&inner.uuid),
            level: inner.geo.level,
            k: inner.geo.k,
            m: inner.geo.m,
            groups: inner.geo.groups,
            strip_bytes: inner.geo.strip_bytes,
            capacity: inner.geo.capacity(),
            state,
            generation: meta.generation,
            recon_prio: meta.recon_prio,
            drives,
            rebuild,
            scrub: (scrub_total > 0).then(|| (inner.scrub_done.load(Ordering::Acquire), scrub_total)),
            dirty_regions: inner.wil.dirty_regions(),
            wil_region_bytes: inner.wil_region_stripes * inner.geo.stripe_data_bytes(),
            stats: self.stats(),
        }
    }

    /// Read `buf.len()` bytes at `offset`. Any offset and length; 4 KiB-aligned buffers,
    /// offsets and lengths are read straight into `buf` without a copy.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.check_range(offset, buf.len())?;
        bump(&self.inner.stats.reads);
        for _ in 0..=self.inner.geo.drive_count() {
            match self.inner.read_range(offset, buf) {
                Ok(()) => return Ok(()),
                Err(StripeError::Retry) => continue,
                Err(StripeError::Fatal(e)) => return Err(e),
            }
        }
        Err(self.inner.offline_error("drives kept failing during one read"))
    }

    /// Write `data` at `offset`. Returns once data and parity are on the drives.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let inner = &self.inner;
        inner.check_range(offset, data.len())?;
        bump(&inner.stats.writes);
        let sd = inner.geo.stripe_data_bytes();
        let mut pos = 0usize;
        while pos < data.len() {
            let at = offset + pos as u64;
            let stripe = at / sd;
            let a = at % sd;
            let left = (data.len() - pos) as u64;
            if a == 0 && left >= sd {
                let n = (left / sd).min(WRITE_BATCH_STRIPES_MAX);
                let len = (n * sd) as usize;
                inner.write_full_locked(stripe, &data[pos..pos + len])?;
                pos += len;
            } else {
                let n = ((sd - a) as usize).min(data.len() - pos);
                inner.write_stripe_locked(stripe, a, &data[pos..pos + n])?;
                pos += n;
            }
        }
        Ok(())
    }

    /// Read `buf` at `offset`, a range within one strip, decoded from the other strips of
    /// its stripe instead of read from the drive that holds it: for a caller whose own
    /// checksum found that drive's bytes wrong. Fails when the stripe has no redundancy
    /// to spare.
    pub fn reconstruct(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let inner = &self.inner;
        let (stripe, t) = inner.one_strip(offset, buf.len(), false)?;
        for _ in 0..=inner.geo.drive_count() {
            let mut list =
                vec![DegradedStripe { stripe, touches: vec![t], dsts: vec![&mut *buf], distrust: Some(t.shard) }];
            match inner.read_degraded(&mut list) {
                Ok(()) => return Ok(()),
                Err(StripeError::Retry) => continue,
                Err(StripeError::Fatal(e)) => return Err(e),
            }
        }
        Err(inner.offline_error("drives kept failing during one reconstruction"))
    }

    /// Write `data` at `offset`, a sector-aligned range within one strip, onto the drive
    /// that holds it, leaving parity as it is: the repair of bytes found wrong on that drive
    /// while the rest of the stripe still knew them ([`reconstruct`](Self::reconstruct)).
    /// The caller makes sure no write to the range runs meanwhile. False when the drive
    /// is gone (its strip is decoded on every read: nothing to mend).
    pub fn repair(&self, offset: u64, data: &[u8]) -> Result<bool> {
        let inner = &self.inner;
        let (stripe, t) = inner.one_strip(offset, data.len(), true)?;
        let _guard = inner.locks.lock(stripe);
        let (row, views) = inner.view(stripe);
        let v = &views[t.shard];
        let Some(drive) = v.drive.clone().filter(|_| v.writable) else { return Ok(false) };
        let mut b = inner.pool.take(data.len());
        b[..data.len()].copy_from_slice(data);
        let r = drive.write_at(&b[..data.len()], inner.drive_offset(row, t.lo));
        inner.pool.give(b);
        r.map_err(|source| RaidError::DriveIo { path: drive.path().to_path_buf(), source })?;
        inner.stats.repairs.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Make every completed write durable on the drives.
    pub fn flush(&self) -> Result<()> {
        self.inner.sync_all()
    }

    /// Mark a drive failed by command. Refused if it would take the volume offline.
    pub fn fail_drive(&self, slot: usize) -> Result<()> {
        let inner = &self.inner;
        {
            let slots = inner.read_slots();
            let s = slots.get(slot).ok_or(RaidError::NoSuchSlot { slot, count: slots.len() })?;
            if s.state == SlotState::Failed {
                return Err(RaidError::WrongDriveState {
                    slot,
                    state: s.state.name().into(),
                    action: "fail",
                    needed: "an online or rebuilding drive",
                });
            }
            let group = slot / inner.geo.width();
            let missing = inner.missing_in_group(&slots, group) + usize::from(s.state == SlotState::Online);
            if missing > inner.geo.m {
                return Err(RaidError::WouldGoOffline {
                    slot,
                    volume: inner.name.clone(),
                    reason: format!("group {group} would miss {missing} drives and tolerates {}", inner.geo.m),
                });
            }
        }
        inner.fail_slot(slot);
        Ok(())
    }

    /// Put `drive` in the place of failed slot `slot` and rebuild it in the background.
    /// The newcomer must not carry a Nacre superblock (of this volume or another), so that
    /// a mistyped path never overwrites a live drive.
    pub fn replace_drive(&self, slot: usize, drive: Arc<dyn BlockDevice>) -> Result<()> {
        let inner = &self.inner;
        // A rebuild whose drive just failed may still be on its way out.
        self.wait_rebuild();
        let needed = DATA_OFFSET + inner.geo.rows * inner.geo.strip_bytes;
        if drive.size() < needed {
            return Err(RaidError::DriveTooSmall { path: drive.path().to_path_buf(), size: drive.size(), needed });
        }
        match read_superblock(drive.as_ref()) {
            Err(RaidError::NoSuperblock { .. }) => {}
            Ok(sb) => return Err(RaidError::DriveInUse { path: drive.path().to_path_buf(), volume: sb.name }),
            Err(RaidError::CorruptSuperblock { .. }) => {
                return Err(RaidError::DriveInUse { path: drive.path().to_path_buf(), volume: "(damaged)".into() });
            }
            Err(e) => return Err(e),
        }
        {
            let slots = inner.read_slots();
            let count = slots.len();
            let same = |d: &Arc<dyn BlockDevice>| {
                d.path() == drive.path() || (d.identity().is_some() && d.identity() == drive.identity())
            };
            if slots.iter().any(|s| s.drive.as_ref().is_some_and(same)) {
                return Err(RaidError::DriveInUse { path: drive.path().to_path_buf(), volume: inner.name.clone() });
            }
            let s = slots.get(slot).ok_or(RaidError::NoSuchSlot { slot, count })?;
            if s.state != SlotState::Failed {
                return Err(RaidError::WrongDriveState {
                    slot,
                    state: s.state.name().into(),
                    action: "replace",
                    needed: "a failed slot (fail the drive first)",
                });
            }
        }
        // Zero the bitmap area of the newcomer before it carries a superblock.
        let zeros =
            AlignedBuf::zeroed(inner.wil_bits.div_ceil(8).div_ceil(SECTOR_BYTES as u64) as usize * SECTOR_BYTES);
        let reserved = AlignedBuf::zeroed((WIL_OFFSET - RESERVED_OFFSET) as usize);
        drive.write_at(&reserved, RESERVED_OFFSET).map_err(|e| RaidError::io(drive.path(), e))?;
        drive.write_at(&zeros, WIL_OFFSET).map_err(|e| RaidError::io(drive.path(), e))?;
        // Claim the rebuild under the metadata lock: one rebuild at a time.
        let mut meta = inner.lock_meta();
        if meta.rebuild_slot != NO_SLOT {
            return Err(RaidError::RebuildRunning(inner.name.clone()));
        }
        {
            let mut slots = inner.write_slots();
            if slots[slot].state != SlotState::Failed {
                return Err(RaidError::WrongDriveState {
                    slot,
                    state: slots[slot].state.name().into(),
                    action: "replace",
                    needed: "a failed slot",
                });
            }
            // Progress and readability go to zero before the slot becomes writable, so no
            // reader ever trusts the blank drive.
            inner.rebuild_row.store(0, Ordering::Release);
            inner.rebuild_readable.store(0, Ordering::Release);
            let s = &mut slots[slot];
            s.drive = Some(drive);
            s.tag = u32::from_le_bytes(random_bytes());
            s.state = SlotState::Rebuilding;
        }
        meta.rebuild_slot = slot as u16;
        meta.rebuild_row = 0;
        inner.persist_locked(&mut meta, &[])?;
        drop(meta);
        self.start_rebuild(slot);
        Ok(())
    }

    /// True while a rebuild thread runs.
    pub fn rebuild_running(&self) -> bool {
        self.inner.rebuild_running.load(Ordering::Acquire)
    }

    fn start_rebuild(&self, slot: usize) {
        let inner = self.inner.clone();
        inner.rebuild_running.store(true, Ordering::Release);
        let handle = std::thread::Builder::new()
            .name(format!("raid-rebuild-{}", inner.name))
            .spawn(move || {
                inner.rebuild(slot);
                inner.rebuild_running.store(false, Ordering::Release);
            })
            .expect("spawn rebuild thread");
        self.tasks.lock().unwrap_or_else(|e| e.into_inner()).push(handle);
    }

    /// Block until a running rebuild has finished (or stopped).
    pub fn wait_rebuild(&self) {
        while self.inner.rebuild_running.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn set_recon_prio(&self, prio: u8) -> Result<()> {
        if !(1..=100).contains(&prio) {
            return Err(RaidError::BadGeometry(format!("recon_prio {prio} is not within 1..=100")));
        }
        self.inner.persist(|m| m.recon_prio = prio)
    }

    /// Check parity of every stripe (or a range) and repair mismatches if asked.
    /// `progress(done, total)` is called as stripes are checked.
    pub fn scrub(&self, repair: bool, mut progress: impl FnMut(u64, u64)) -> Result<ScrubReport> {
        let total = self.inner.geo.stripes();
        self.inner.scrub_total.store(total, Ordering::Release);
        let mut report = ScrubReport::default();
        let result = (|| {
            for stripe in 0..total {
                self.inner.scrub_stripe(stripe, repair, &mut report)?;
                self.inner.scrub_done.store(stripe + 1, Ordering::Release);
                if stripe % 64 == 63 || stripe + 1 == total {
                    progress(stripe + 1, total);
                }
            }
            Ok(report)
        })();
        self.inner.scrub_total.store(0, Ordering::Release);
        result
    }

    fn resync(&self, stripes: std::ops::Range<u64>, mut progress: impl FnMut(u64, u64)) -> Result<ScrubReport> {
        let mut report = ScrubReport::default();
        let total = stripes.end - stripes.start;
        for (i, stripe) in stripes.enumerate() {
            self.inner.scrub_stripe(stripe, true, &mut report)?;
            progress(i as u64 + 1, total);
        }
        Ok(report)
    }

    /// Stripe ranges whose write-intent bit is set on any of `drives`.
    fn dirty_stripes_on_disk(&self, drives: &[Arc<dyn BlockDevice>]) -> Vec<std::ops::Range<u64>> {
        let inner = &self.inner;
        let bytes = inner.wil_bits.div_ceil(8).div_ceil(SECTOR_BYTES as u64) as usize * SECTOR_BYTES;
        let mut union = vec![0u8; bytes];
        let mut buf = AlignedBuf::zeroed(bytes);
        for d in drives {
            if d.read_at(&mut buf, WIL_OFFSET).is_ok() {
                for (u, b) in union.iter_mut().zip(buf.iter()) {
                    *u |= *b;
                }
            }
        }
        let rs = inner.wil_region_stripes;
        Wil::set_bits(&union, inner.wil_bits)
            .into_iter()
            .map(|r| r * rs..((r + 1) * rs).min(inner.geo.stripes()))
            .collect()
    }

    /// Stop background threads and drop the volume as a crash would: the write-intent
    /// bits and the "not clean" flag stay on the drives. For crash tests.
    pub fn halt_without_cleanup(self) {
        self.closed.store(true, Ordering::Release);
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake.1.notify_all();
        for t in self.tasks.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = t.join();
        }
    }

    /// Stop background work, clear the write-intent log and mark the volume clean.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake.1.notify_all();
        for t in self.tasks.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = t.join();
        }
        self.inner.clean_wil(true)?;
        // The rebuild thread has stopped: every row it counted is written.
        let done = self.inner.rebuild_row.load(Ordering::Acquire);
        self.inner.persist(|m| {
            m.clean = true;
            if m.rebuild_slot != NO_SLOT {
                m.rebuild_row = done;
            }
        })
    }

    /// Render `show`'s table.
    pub fn render_status(&self) -> String {
        render_status(&self.status())
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Slots as `show` lists them; a slot without a drive is failed whatever its record says.
fn drive_statuses(slots: &[Slot], width: usize) -> Vec<DriveStatus> {
    slots
        .iter()
        .enumerate()
        .map(|(i, s)| DriveStatus {
            slot: i,
            group: i / width,
            path: s.drive.as_ref().map(|d| d.path().to_path_buf()),
            state: if s.drive.is_some() { s.state } else { SlotState::Failed },
        })
        .collect()
}

/// The worst group decides: more than `m` failed is offline, any failed is degraded.
fn volume_state(drives: &[DriveStatus], width: usize, m: usize) -> VolumeState {
    let mut worst = VolumeState::Optimal;
    for group in drives.chunks(width) {
        let failed = group.iter().filter(|d| d.state == SlotState::Failed).count();
        if failed > m {
            return VolumeState::Offline;
        }
        if failed > 0 {
            worst = VolumeState::Degraded;
        } else if worst == VolumeState::Optimal && group.iter().any(|d| d.state == SlotState::Rebuilding) {
            worst = VolumeState::Rebuilding;
        }
    }
    worst
}

/// A table in the spirit of `xicli raid show`.
pub fn render_status(st: &Status) -> String {
    let mut left = vec![
        if st.capacity >= 10 << 30 {
            format!("size: {} GiB", st.capacity >> 30)
        } else {
            format!("size: {} MiB", st.capacity >> 20)
        },
        format!("level: {}", st.level),
        format!("strip_size: {}", st.strip_bytes >> 10),
        format!("block_size: {SECTOR_BYTES}"),
    ];
    if st.groups > 1 {
        left.insert(2, format!("group_size: {}", st.k + st.m));
    }
    left.push(format!("data/parity: {}+{}", st.k, st.m));
    left.push(format!("uuid: {}", &st.uuid[..8]));
    let mut drives = Vec::new();
    for d in &st.drives {
        if st.groups > 1 && d.slot % (st.k + st.m) == 0 {
            drives.push(format!("--------gr:{:02}--------", d.group + 1));
        }
        let path = d.path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "-".into());
        let mut s = format!("{} {} {}", d.slot, path, d.state.name());
        if let Some((slot, done, total)) = st.rebuild
            && slot == d.slot
        {
            s += &format!(" {}%", done * 100 / total.max(1));
        }
        drives.push(s);
    }
    let mut right = vec![
        format!("recon_prio: {}", st.recon_prio),
        format!("generation: {}", st.generation),
        format!("wil_region_mb: {}", st.wil_region_bytes >> 20),
        format!("wil_dirty_regions: {}", st.dirty_regions),
    ];
    if let Some((slot, done, total)) = st.rebuild {
        right.push(format!("rebuild: slot {slot} {:.1}%", done as f64 * 100.0 / total.max(1) as f64));
    }
    if let Some((done, total)) = st.scrub {
        right.push(format!("scrub: {:.1}%", done as f64 * 100.0 / total.max(1) as f64));
    }
    let rows = left.len().max(drives.len()).max(right.len());
    let cols = [
        ("name", vec![st.name.clone()]),
        ("static", left),
        ("state", vec![st.state.name().to_string()]),
        ("devices", drives),
        ("info", right),
    ];
    let widths: Vec<usize> =
        cols.iter().map(|(h, v)| v.iter().map(|s| s.chars().count()).chain([h.len()]).max().unwrap_or(0)).collect();
    let line = |l: char, m: char, r: char| {
        let mut s = String::new();
        s.push(l);
        for (i, w) in widths.iter().enumerate() {
            s.extend(std::iter::repeat_n('═', w + 2));
            s.push(if i + 1 == widths.len() { r } else { m });
        }
        s.push('\n');
        s
    };
    let mut out = line('╔', '╦', '╗');
    let _ = write!(out, "║");
    for ((h, _), w) in cols.iter().zip(&widths) {
        let _ = write!(out, " {h:<w$} ║");
    }
    out.push('\n');
    out += &line('╠', '╬', '╣');
    for r in 0..rows {
        let _ = write!(out, "║");
        for ((_, v), w) in cols.iter().zip(&widths) {
            let cell = v.get(r).map(String::as_str).unwrap_or("");
            let _ = write!(out, " {cell:<w$} ║");
        }
        out.push('\n');
    }
    out += &line('╚', '╩', '╝');
    out
}

fn write_sb(d: &dyn BlockDevice, sb: &Superblock) -> std::io::Result<()> {
    let mut buf = AlignedBuf::zeroed(SB_BYTES);
    buf.copy_from_slice(&sb.encode());
    for off in SB_OFFSETS {
        d.write_at(&buf, off)?;
        // The second copy is written only once the first is durable: one always survives.
        d.sync()?;
    }
    Ok(())
}

impl Inner {
    fn lock_meta(&self) -> std::sync::MutexGuard<'_, Meta> {
        self.meta.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read_slots(&self) -> std::sync::RwLockReadGuard<'_, Vec<Slot>> {
        self.slots.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_slots(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Slot>> {
        self.slots.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The stripe and the one strip piece of `[offset, offset + len)`, which must lie in
    /// one strip (and cover whole sectors, if `sectors`).
    fn one_strip(&self, offset: u64, len: usize, sectors: bool) -> Result<(u64, Touch)> {
        self.check_range(offset, len)?;
        let sd = self.geo.stripe_data_bytes();
        let what = if sectors { "whole sectors within one strip" } else { "within one strip" };
        let bad = RaidError::NotOneStrip { offset, len: len as u64, what };
        let [t] = self.touches(offset % sd, len)[..] else { return Err(bad) };
        let sector = SECTOR_BYTES as u64;
        if sectors && (!t.lo.is_multiple_of(sector) || !(len as u64).is_multiple_of(sector)) {
            return Err(bad);
        }
        Ok((offset / sd, t))
    }

    fn check_range(&self, offset: u64, len: usize) -> Result<()> {
        let size = self.geo.capacity();
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(RaidError::OutOfRange { offset, len: len as u64, size });
        }
        Ok(())
    }

    fn missing_in_group(&self, slots: &[Slot], group: usize) -> usize {
        let w = self.geo.width();
        slots[group * w..(group + 1) * w].iter().filter(|s| s.state != SlotState::Online).count()
    }

    fn state_of(&self, slots: &[Slot]) -> VolumeState {
        volume_state(&drive_statuses(slots, self.geo.width()), self.geo.width(), self.geo.m)
    }

    fn offline_error(&self, reason: &str) -> RaidError {
        let slots = self.read_slots();
        let failed: Vec<String> = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state != SlotState::Online)
            .map(|(i, s)| format!("slot {i} {}", s.state.name()))
            .collect();
        let first = self
            .first_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|e| format!("; first drive error: {e}"))
            .unwrap_or_default();
        RaidError::Offline {
            volume: self.name.clone(),
            reason: format!("{reason}; {} (tolerates {} per group){first}", failed.join(", "), self.geo.m),
        }
    }

    /// The shards of a stripe as the slot table sees them now.
    fn view(&self, stripe: u64) -> (u64, Vec<ShardView>) {
        let (group, row) = self.geo.stripe_home(stripe);
        let slots = self.read_slots();
        let rebuilt = self.rebuild_readable.load(Ordering::Acquire);
        let views = (0..self.geo.width())
            .map(|shard| {
                let slot = group * self.geo.width() + self.geo.member(row, shard);
                let s = &slots[slot];
                let (readable, writable) = match s.state {
                    SlotState::Online => (true, true),
                    SlotState::Rebuilding => (row < rebuilt, true),
                    SlotState::Failed => (false, false),
                };
                ShardView {
                    slot,
                    drive: s.drive.clone(),
                    readable: readable && s.drive.is_some(),
                    writable: writable && s.drive.is_some(),
                }
            })
            .collect();
        (row, views)
    }

    fn drive_offset(&self, row: u64, within: u64) -> u64 {
        DATA_OFFSET + row * self.geo.strip_bytes + within
    }

    /// Persist the superblocks after `change` to the metadata; bumps the generation.
    fn persist(&self, change: impl FnOnce(&mut Meta)) -> Result<()> {
        let mut meta = self.lock_meta();
        change(&mut meta);
        self.persist_locked(&mut meta, &[])
    }

    /// Write every live drive's superblock from `meta` and the slot table, with the slot
    /// states in `overrides` recorded instead of the in-memory ones (a state change is made
    /// durable before it takes effect). A drive that cannot take its superblock is failed,
    /// and the others are written again so that they record it; bounded by the drive count.
    fn persist_locked(&self, meta: &mut Meta, overrides: &[(usize, SlotState)]) -> Result<()> {
        for _ in 0..=self.geo.drive_count() {
            meta.generation += 1;
            let slots = self.read_slots();
            let state_of = |i: usize, s: &Slot| overrides.iter().find(|(j, _)| *j == i).map_or(s.state, |(_, st)| *st);
            let table: Vec<SlotEntry> =
                slots.iter().enumerate().map(|(i, s)| SlotEntry { tag: s.tag, state: state_of(i, s) }).collect();
            let mut failures = Vec::new();
            for (i, s) in slots.iter().enumerate() {
                let Some(d) = s.drive.as_ref() else { continue };
                if table[i].state == SlotState::Failed {
                    continue;
                }
                let sb = Superblock {
                    volume_uuid: self.uuid,
                    name: self.name.clone(),
                    level: self.geo.level,
                    k: self.geo.k as u16,
                    m: self.geo.m as u16,
                    groups: self.geo.groups as u16,
                    drive_count: slots.len() as u16,
                    strip_bytes: self.geo.strip_bytes as u32,
                    rows: self.geo.rows,
                    data_offset: DATA_OFFSET,
                    wil_offset: WIL_OFFSET,
                    wil_region_stripes: self.wil_region_stripes,
                    wil_bits: self.wil_bits,
                    generation: meta.generation,
                    clean: meta.clean,
                    recon_prio: meta.recon_prio,
                    drive_index: i as u16,
                    drive_tag: s.tag,
                    rebuild_slot: meta.rebuild_slot,
                    rebuild_row: meta.rebuild_row,
                    created_unix: self.created_unix,
                    slots: table.clone(),
                };
                if write_sb(d.as_ref(), &sb).is_err() {
                    failures.push(i);
                }
            }
            drop(slots);
            if failures.is_empty() {
                return Ok(());
            }
            let mut slots = self.write_slots();
            for i in failures {
                slots[i].state = SlotState::Failed;
                slots[i].drive = None;
                if meta.rebuild_slot == i as u16 {
                    meta.rebuild_slot = NO_SLOT;
                    meta.rebuild_row = 0;
                }
            }
        }
        Err(self.offline_error("superblocks could not be written"))
    }

    /// Mark a slot failed (after IO errors or by command). The failure is on the other
    /// drives before any writer may skip the slot: a write acknowledged without it must
    /// not meet the stale drive again after a crash.
    fn fail_slot(&self, slot: usize) {
        let mut meta = self.lock_meta();
        if self.read_slots()[slot].state == SlotState::Failed {
            return;
        }
        if meta.rebuild_slot == slot as u16 {
            meta.rebuild_slot = NO_SLOT;
            meta.rebuild_row = 0;
        }
        // Offline or not, the slot is failed in memory; the error, if any, reaches the
        // caller through the IO that needed the slot.
        let _ = self.persist_locked(&mut meta, &[(slot, SlotState::Failed)]);
        let mut slots = self.write_slots();
        slots[slot].state = SlotState::Failed;
        slots[slot].drive = None;
    }

    fn fail_all(&self, failures: &[IoFailure]) {
        if let Some(f) = failures.first() {
            self.first_failure.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| f.error.to_string());
        }
        for f in failures {
            self.fail_slot(f.slot);
        }
    }

    fn sync_all(&self) -> Result<()> {
        let drives: Vec<(usize, Arc<dyn BlockDevice>)> = self
            .read_slots()
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state != SlotState::Failed)
            .filter_map(|(i, s)| s.drive.clone().map(|d| (i, d)))
            .collect();
        self.flush_drives(&drives);
        if self.state_of(&self.read_slots()) == VolumeState::Offline {
            return Err(self.offline_error("drives failed during sync"));
        }
        Ok(())
    }

    /// Flush every drive at once (a flush costs a device round trip; ten in a row cost ten).
    fn flush_drives(&self, drives: &[(usize, Arc<dyn BlockDevice>)]) {
        let reqs = drives
            .iter()
            .map(|(slot, d)| IoReq { slot: *slot, drive: d.clone(), offset: 0, buf: IoBuf::Flush })
            .collect();
        let failures = self.queues.run(reqs);
        self.fail_all(&failures);
    }

    fn write_bitmap(&self, writes: &[BitmapWrite]) -> Result<()> {
        let drives: Vec<(usize, Arc<dyn BlockDevice>)> = self
            .read_slots()
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state != SlotState::Failed)
            .filter_map(|(i, s)| s.drive.clone().map(|d| (i, d)))
            .collect();
        let mut bufs = Vec::with_capacity(writes.len());
        for w in writes {
            let mut b = AlignedBuf::zeroed(SECTOR_BYTES);
            b.copy_from_slice(&w.bytes);
            bufs.push((WIL_OFFSET + w.sector * SECTOR_BYTES as u64, b));
        }
        let mut reqs = Vec::new();
        for (slot, d) in &drives {
            for (off, b) in &bufs {
                reqs.push(IoReq { slot: *slot, drive: d.clone(), offset: *off, buf: IoBuf::Write(b) });
            }
        }
        let failures = self.queues.run(reqs);
        self.fail_all(&failures);
        self.flush_drives(&drives);
        if self.state_of(&self.read_slots()) == VolumeState::Offline {
            return Err(self.offline_error("drives failed while writing the write-intent bitmap"));
        }
        Ok(())
    }

    /// Clear every bit of the on-drive bitmap on every live drive, once a whole-volume
    /// initialization or a resync has made the marked stripes consistent.
    fn clear_whole_bitmap(&self) -> Result<()> {
        let sectors = self.wil_bits.div_ceil(8).div_ceil(SECTOR_BYTES as u64);
        let writes: Vec<BitmapWrite> =
            (0..sectors).map(|sector| BitmapWrite { sector, bytes: vec![0; SECTOR_BYTES] }).collect();
        self.write_bitmap(&writes)
    }

    fn clean_wil(&self, all: bool) -> Result<usize> {
        self.wil.clean_pass(all, || self.sync_all(), |writes| self.write_bitmap(&writes))
    }

    /// Run drive IO on behalf of clients (everything but the rebuild), counting it.
    fn run(&self, reqs: Vec<IoReq<'_>>) -> Vec<IoFailure> {
        let mut bytes = 0;
        for r in &reqs {
            match &r.buf {
                IoBuf::Read(b) => {
                    bump(&self.stats.drive_reads);
                    bytes += b.len() as u64;
                }
                IoBuf::Write(b) => {
                    bump(&self.stats.drive_writes);
                    bytes += b.len() as u64;
                }
                IoBuf::Flush => {}
            }
        }
        self.foreground_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.queues.run(reqs)
    }

    /// Which data strips of a stripe `[a, a + len)` touches (stripe-relative bytes).
    fn touches(&self, a: u64, len: usize) -> Vec<Touch> {
        let s = self.geo.strip_bytes;
        let b = a + len as u64;
        let mut out = Vec::new();
        let mut user = 0usize;
        let mut pos = a;
        while pos < b {
            let shard = (pos / s) as usize;
            let lo = pos % s;
            let hi = (s).min(lo + (b - pos));
            out.push(Touch { shard, lo, hi, user });
            user += (hi - lo) as usize;
            pos += hi - lo;
        }
        out
    }

    // ---------------------------------------------------------------- reads

    fn read_range(&self, offset: u64, buf: &mut [u8]) -> std::result::Result<(), StripeError> {
        let sd = self.geo.stripe_data_bytes();
        // Healthy pieces are gathered into batches so one caller keeps every drive busy.
        struct Piece<'a> {
            dst: &'a mut [u8],
            slot: usize,
            drive: Arc<dyn BlockDevice>,
            offset: u64,
            bounce: Option<(AlignedBuf, usize)>,
        }
        let mut batch: Vec<Piece<'_>> = Vec::new();
        let flush = |batch: &mut Vec<Piece<'_>>| -> std::result::Result<(), StripeError> {
            let mut reqs = Vec::with_capacity(batch.len());
            for p in batch.iter_mut() {
                let b: &mut [u8] = match p.bounce.as_mut() {
                    Some((bounce, _)) => bounce,
                    None => p.dst,
                };
                reqs.push(IoReq { slot: p.slot, drive: p.drive.clone(), offset: p.offset, buf: IoBuf::Read(b) });
            }
            let failures = self.run(reqs);
            if !failures.is_empty() {
                self.fail_all(&failures);
                for p in batch.drain(..) {
                    if let Some((b, _)) = p.bounce {
                        self.pool.give(b);
                    }
                }
                return Err(StripeError::Retry);
            }
            for p in batch.drain(..) {
                if let Some((b, skip)) = p.bounce {
                    p.dst.copy_from_slice(&b[skip..skip + p.dst.len()]);
                    self.pool.give(b);
                }
            }
            Ok(())
        };
        let mut degraded: Vec<DegradedStripe<'_>> = Vec::new();
        let mut rest: &mut [u8] = buf;
        let mut at = offset;
        while !rest.is_empty() {
            let stripe = at / sd;
            let a = at % sd;
            let n = ((sd - a) as usize).min(rest.len());
            let (this, tail) = std::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            at += n as u64;
            let touches = self.touches(a, n);
            let (row, views) = self.view(stripe);
            let mut dsts = Vec::with_capacity(touches.len());
            let mut this = this;
            for t in &touches {
                let (dst, more) = std::mem::take(&mut this).split_at_mut(t.len());
                this = more;
                dsts.push(dst);
            }
            if touches.iter().all(|t| views[t.shard].readable) {
                for (t, dst) in touches.iter().zip(dsts) {
                    let v = &views[t.shard];
                    let Some(drive) = v.drive.clone() else { return Err(StripeError::Retry) };
                    let direct = is_aligned(dst) && t.lo.is_multiple_of(SECTOR_BYTES as u64);
                    let (offset, bounce) = if direct {
                        (self.drive_offset(row, t.lo), None)
                    } else {
                        let b = self.pool.take((t.shi() - t.slo()) as usize);
                        (self.drive_offset(row, t.slo()), Some((b, (t.lo - t.slo()) as usize)))
                    };
                    batch.push(Piece { dst, slot: v.slot, drive, offset, bounce });
                }
            } else {
                degraded.push(DegradedStripe { stripe, touches, dsts, distrust: None });
            }
            if batch.len() >= READ_BATCH_REQS_MAX || degraded.len() >= DEGRADED_BATCH_STRIPES_MAX {
                flush(&mut batch)?;
                self.read_degraded(&mut degraded)?;
            }
        }
        flush(&mut batch)?;
        self.read_degraded(&mut degraded)
    }

    /// Read stripes whose touched strips are partly missing: decode them from the
    /// survivors. The stripes are locked (ascending) so that no write changes data and
    /// parity under the decode. All their reads go out in one batch; strips that line up
    /// with the caller's buffer are read and decoded straight into it, so a degraded
    /// full-stripe read copies nothing.
    fn read_degraded(&self, list: &mut Vec<DegradedStripe<'_>>) -> std::result::Result<(), StripeError> {
        if list.is_empty() {
            return Ok(());
        }
        let k = self.geo.k;
        self.stats.degraded_reads.fetch_add(list.len() as u64, Ordering::Relaxed);
        let _guards: Vec<_> = list.iter().map(|d| self.locks.lock(d.stripe)).collect();
        // Plan each stripe: which shards to read, into what.
        struct Plan {
            row: u64,
            views: Vec<ShardView>,
            u0: u64,
            inputs: Vec<usize>,
            wanted: Vec<usize>,
            /// For each shard: the touch whose buffer it lands in directly, if any.
            direct: Vec<Option<usize>>,
            /// Pool buffers of the shards that are not direct, by shard.
            bufs: Vec<Option<AlignedBuf>>,
        }
        let mut plans = Vec::with_capacity(list.len());
        for d in list.iter() {
            let (row, mut views) = self.view(d.stripe);
            if let Some(x) = d.distrust {
                views[x].readable = false;
            }
            let u0 = d.touches.iter().map(Touch::slo).min().unwrap_or(0);
            let u1 = d.touches.iter().map(Touch::shi).max().unwrap_or(0);
            let inputs: Vec<usize> = (0..self.geo.width()).filter(|&x| views[x].readable).take(k).collect();
            if inputs.len() < k {
                plans.into_iter().for_each(|p: Plan| p.bufs.into_iter().flatten().for_each(|b| self.pool.give(b)));
                return Err(StripeError::Fatal(
                    self.offline_error(&format!("stripe {} has fewer than {k} readable strips", d.stripe)),
                ));
            }
            let wanted: Vec<usize> = d.touches.iter().map(|t| t.shard).filter(|x| !inputs.contains(x)).collect();
            let mut direct = vec![None; self.geo.width()];
            for (i, t) in d.touches.iter().enumerate() {
                if t.lo == u0 && t.hi == u1 && is_aligned(d.dsts[i]) {
                    direct[t.shard] = Some(i);
                }
            }
            let bufs = (0..self.geo.width())
                .map(|x| {
                    let used = inputs.contains(&x) || wanted.contains(&x);
                    (used && direct[x].is_none()).then(|| self.pool.take((u1 - u0) as usize))
                })
                .collect();
            plans.push(Plan { row, views, u0, inputs, wanted, direct, bufs });
        }
        // Where each shard's bytes live: the caller's buffer or a pool buffer.
        fn targets<'b>(plan: &'b mut Plan, dsts: &'b mut [&mut [u8]]) -> Vec<Option<&'b mut [u8]>> {
            let mut by_touch: Vec<Option<&'b mut [u8]>> = dsts.iter_mut().map(|d| Some(&mut **d)).collect();
            plan.bufs
                .iter_mut()
                .zip(&plan.direct)
                .map(|(b, dir)| match (b, dir) {
                    (Some(b), _) => Some(&mut b[..]),
                    (None, Some(i)) => by_touch[*i].take(),
                    (None, None) => None,
                })
                .collect()
        }
        let mut reqs = Vec::new();
        for (plan, d) in plans.iter_mut().zip(list.iter_mut()) {
            let (row, u0, inputs, views) = (plan.row, plan.u0, plan.inputs.clone(), plan.views.clone());
            let mut t = targets(plan, &mut d.dsts);
            for x in inputs {
                let buf = t[x].take().expect("every input shard has a target");
                let v = &views[x];
                let drive = v.drive.clone().expect("readable shard has a drive");
                reqs.push(IoReq { slot: v.slot, drive, offset: self.drive_offset(row, u0), buf: IoBuf::Read(buf) });
            }
        }
        let failures = self.run(reqs);
        let result = if failures.is_empty() {
            for (plan, d) in plans.iter_mut().zip(list.iter_mut()) {
                if !plan.wanted.is_empty() {
                    let dec = self.codec.decoder(&plan.inputs, &plan.wanted).map_err(RaidError::from)?;
                    let wanted = plan.wanted.clone();
                    let mut t = targets(plan, &mut d.dsts);
                    let ins: Vec<&[u8]> =
                        dec.inputs().iter().map(|&x| &*t[x].take().expect("input shard target")).collect();
                    let mut outs: Vec<&mut [u8]> =
                        wanted.iter().map(|&x| t[x].take().expect("wanted shard target")).collect();
                    dec.apply(&ins, &mut outs);
                }
                for (i, tch) in d.touches.iter().enumerate() {
                    if plan.direct[tch.shard].is_none() {
                        let src = plan.bufs[tch.shard].as_ref().expect("shard was read or decoded");
                        let from = (tch.lo - plan.u0) as usize;
                        d.dsts[i].copy_from_slice(&src[from..from + tch.len()]);
                    }
                }
            }
            Ok(())
        } else {
            self.fail_all(&failures);
            Err(StripeError::Retry)
        };
        for p in plans {
            p.bufs.into_iter().flatten().for_each(|b| self.pool.give(b));
        }
        list.clear();
        result
    }

    // ---------------------------------------------------------------- writes

    /// Lock and mark whole stripes (ascending, so writers never deadlock), write them.
    fn write_full_locked(&self, first: u64, src: &[u8]) -> Result<()> {
        let n = src.len() as u64 / self.geo.stripe_data_bytes();
        let _guards: Vec<_> = (first..first + n).map(|st| self.locks.lock(st)).collect();
        let mut regions = Vec::with_capacity(n as usize);
        let mut result = Ok(());
        for st in first..first + n {
            match self.mark(st) {
                Ok(r) => regions.push(r),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if result.is_ok() {
            result = match self.write_full_stripes(first, src) {
                Ok(()) => Ok(()),
                Err(StripeError::Fatal(e)) => Err(e),
                Err(StripeError::Retry) => Err(self.offline_error("a full-stripe write asked to retry")),
            };
        }
        for r in regions {
            self.unmark(r);
        }
        result
    }

    /// Record a write to `stripe` in the write-intent log. Without parity (RAID0) there is
    /// no write hole and nothing to record.
    fn mark(&self, stripe: u64) -> Result<Option<usize>> {
        if self.geo.m == 0 {
            return Ok(None);
        }
        self.wil.begin(stripe, |w| self.write_bitmap(&[w])).map(Some)
    }

    fn unmark(&self, region: Option<usize>) {
        if let Some(r) = region {
            self.wil.end(r);
        }
    }

    fn write_stripe_locked(&self, stripe: u64, a: u64, src: &[u8]) -> Result<()> {
        let _guard = self.locks.lock(stripe);
        let region = self.mark(stripe)?;
        let mut result = Err(self.offline_error("drives kept failing during one write"));
        for _ in 0..=self.geo.drive_count() {
            match self.write_stripe(stripe, a, src) {
                Ok(()) => {
                    result = Ok(());
                    break;
                }
                Err(StripeError::Retry) => continue,
                Err(StripeError::Fatal(e)) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.unmark(region);
        result
    }

    /// One stripe write under its lock: plan, read what the plan needs, compute, write.
    fn write_stripe(&self, stripe: u64, a: u64, src: &[u8]) -> std::result::Result<(), StripeError> {
        if a == 0 && src.len() as u64 == self.geo.stripe_data_bytes() {
            // Takes its own view and makes its own check.
            return self.write_full_stripes(stripe, src);
        }
        let (k, m) = (self.geo.k, self.geo.m);
        let (row, views) = self.view(stripe);
        if views.iter().filter(|v| v.readable).count() < k {
            return Err(StripeError::Fatal(
                self.offline_error(&format!("stripe {stripe} has fewer than {k} writable strips")),
            ));
        }
        let touches = self.touches(a, src.len());
        let u0 = touches.iter().map(Touch::slo).min().unwrap_or(0);
        let u1 = touches.iter().map(Touch::shi).max().unwrap_or(0);
        let ulen = (u1 - u0) as usize;
        let touched = |shard: usize| touches.iter().find(|t| t.shard == shard);
        let covers = |shard: usize| touched(shard).is_some_and(|t| t.lo <= u0 && t.hi >= u1);
        let readable_parity: Vec<usize> = (k..k + m).filter(|&p| views[p].readable).collect();
        // Read-modify-write needs the old contents of everything it updates. A parity strip
        // that is written but not yet trusted (a rebuilding drive above its checkpoint)
        // cannot be updated that way, and skipping it would leave it stale behind a rebuild
        // that has already passed this row: such stripes recompute all parity instead.
        let rmw_ok = touches.iter().all(|t| views[t.shard].readable)
            && (k..k + m).all(|p| views[p].readable || !views[p].writable);
        let rmw_reads = touches.len() + readable_parity.len();
        let rcw_needs: Vec<usize> = (0..k).filter(|&j| !covers(j)).collect();
        let rcw_ok = rcw_needs.iter().all(|&j| views[j].readable);
        enum Plan {
            Rmw,
            Rcw,
            Reconstruct,
        }
        let plan = if rmw_ok && (!rcw_ok || rmw_reads < rcw_needs.len()) {
            Plan::Rmw
        } else if rcw_ok {
            Plan::Rcw
        } else {
            Plan::Reconstruct
        };
        let mut dbuf = self.pool.take(k * ulen);
        let mut pbuf = self.pool.take(m * ulen);
        let result = (|| {
            let (dparts, pparts) = (&mut dbuf[..], &mut pbuf[..]);
            let mut dslices: Vec<&mut [u8]> = dparts.chunks_mut(ulen.max(1)).take(k).collect();
            let mut pslices: Vec<&mut [u8]> = pparts.chunks_mut(ulen.max(1)).take(m).collect();
            // Phase 1: reads.
            let mut reads = Vec::new();
            let mut read_shards: Vec<usize> = Vec::new();
            match plan {
                Plan::Rmw => {
                    for t in &touches {
                        read_shards.push(t.shard);
                    }
                    read_shards.extend(&readable_parity);
                }
                Plan::Rcw => read_shards.extend(&rcw_needs),
                Plan::Reconstruct => {
                    read_shards.extend((0..k + m).filter(|&x| views[x].readable).take(k));
                    if read_shards.len() < k {
                        return Err(StripeError::Fatal(
                            self.offline_error(&format!("stripe {stripe} has fewer than {k} readable strips")),
                        ));
                    }
                }
            }
            {
                let mut dl: Vec<Option<&mut [u8]>> = dslices.iter_mut().map(|x| Some(&mut **x)).collect();
                let mut pl: Vec<Option<&mut [u8]>> = pslices.iter_mut().map(|x| Some(&mut **x)).collect();
                for &shard in &read_shards {
                    let (lo, hi) = match (&plan, touched(shard)) {
                        (Plan::Rmw, Some(t)) if shard < k => (t.slo(), t.shi()),
                        _ => (u0, u1),
                    };
                    let whole = if shard < k { dl[shard].take() } else { pl[shard - k].take() };
                    let Some(whole) = whole else { continue };
                    let part = &mut whole[(lo - u0) as usize..(hi - u0) as usize];
                    reads.push(IoReq {
                        slot: views[shard].slot,
                        drive: views[shard].drive.clone().expect("readable shard has a drive"),
                        offset: self.drive_offset(row, lo),
                        buf: IoBuf::Read(part),
                    });
                }
            }
            let failures = self.run(reads);
            if !failures.is_empty() {
                self.fail_all(&failures);
                return Err(StripeError::Retry);
            }
            // Phase 2: compute.
            match plan {
                Plan::Rmw => {
                    bump(&self.stats.rmw_writes);
                    let mut delta = self.pool.take(ulen);
                    for t in &touches {
                        let from = (t.lo - u0) as usize;
                        let new = &src[t.user..t.user + t.len()];
                        let old = &mut dslices[t.shard][from..from + t.len()];
                        let d = &mut delta[..t.len()];
                        for ((d, o), n) in d.iter_mut().zip(old.iter_mut()).zip(new) {
                            *d = *o ^ *n;
                            *o = *n;
                        }
                        let mut ps: Vec<&mut [u8]> = Vec::with_capacity(m);
                        let mut cols = Vec::with_capacity(m);
                        for (p, slice) in pslices.iter_mut().enumerate() {
                            if views[k + p].readable {
                                ps.push(&mut slice[from..from + t.len()]);
                                cols.push(p);
                            }
                        }
                        self.codec.update_rows(t.shard, &cols, &delta[..t.len()], &mut ps);
                    }
                    self.pool.give(delta);
                }
                Plan::Rcw | Plan::Reconstruct => {
                    if matches!(plan, Plan::Rcw) {
                        bump(&self.stats.rcw_writes);
                    } else {
                        bump(&self.stats.degraded_writes);
                        let wanted: Vec<usize> = (0..k).filter(|j| !read_shards.contains(j)).collect();
                        if !wanted.is_empty() {
                            let dec = self.codec.decoder(&read_shards, &wanted).map_err(RaidError::from)?;
                            let mut ins: Vec<&[u8]> = Vec::with_capacity(k);
                            let mut outs: Vec<&mut [u8]> = Vec::with_capacity(wanted.len());
                            // Inputs in the decoder's order; outputs in `wanted` order.
                            let mut all: Vec<Option<&mut [u8]>> =
                                dslices.iter_mut().chain(pslices.iter_mut()).map(|x| Some(&mut **x)).collect();
                            let mut in_slots: Vec<Option<&[u8]>> = vec![None; k + m];
                            for &x in dec.inputs() {
                                in_slots[x] = all[x].take().map(|b| &*b);
                            }
                            for &x in &wanted {
                                outs.push(all[x].take().expect("wanted shard buffer"));
                            }
                            for &x in dec.inputs() {
                                ins.push(in_slots[x].expect("input shard buffer"));
                            }
                            dec.apply(&ins, &mut outs);
                        }
                    }
                    for t in &touches {
                        let from = (t.lo - u0) as usize;
                        dslices[t.shard][from..from + t.len()].copy_from_slice(&src[t.user..t.user + t.len()]);
                    }
                    if m > 0 {
                        let ds: Vec<&[u8]> = dslices.iter().map(|x| &**x).collect();
                        self.codec.encode(&ds, &mut pslices);
                    }
                }
            }
            // Phase 3: writes. Data over the touched sectors, parity over the union.
            let mut writes = Vec::new();
            for t in &touches {
                let v = &views[t.shard];
                if let (true, Some(d)) = (v.writable, v.drive.clone()) {
                    let part = &dslices[t.shard][(t.slo() - u0) as usize..(t.shi() - u0) as usize];
                    writes.push(IoReq {
                        slot: v.slot,
                        drive: d,
                        offset: self.drive_offset(row, t.slo()),
                        buf: IoBuf::Write(part),
                    });
                }
            }
            for p in 0..m {
                let v = &views[k + p];
                let updated = match plan {
                    Plan::Rmw => v.readable,
                    _ => v.writable,
                };
                if let (true, Some(d)) = (updated, v.drive.clone()) {
                    writes.push(IoReq {
                        slot: v.slot,
                        drive: d,
                        offset: self.drive_offset(row, u0),
                        buf: IoBuf::Write(pslices[p]),
                    });
                }
            }
            let failures = self.run(writes);
            self.after_write_failures(stripe, &failures)
        })();
        self.pool.give(dbuf);
        self.pool.give(pbuf);
        result
    }

    /// Whole stripes `first..first + src.len() / stripe_data_bytes`, already locked and
    /// marked in the write-intent log: parity from the new data alone, every strip of every
    /// stripe in one IO batch so a single writer keeps all drives busy.
    fn write_full_stripes(&self, first: u64, src: &[u8]) -> std::result::Result<(), StripeError> {
        let (k, m) = (self.geo.k, self.geo.m);
        let s = self.geo.strip_bytes as usize;
        let sd = k * s;
        let n = src.len() / sd;
        let views: Vec<(u64, Vec<ShardView>)> = (first..first + n as u64).map(|st| self.view(st)).collect();
        if let Some(bad) = views.iter().position(|(_, v)| v.iter().filter(|x| x.readable).count() < k) {
            let stripe = first + bad as u64;
            return Err(StripeError::Fatal(
                self.offline_error(&format!("stripe {stripe} has fewer than {k} writable strips")),
            ));
        }
        self.stats.full_stripe_writes.fetch_add(n as u64, Ordering::Relaxed);
        let copy = (!is_aligned(src)).then(|| {
            let mut b = self.pool.take(src.len());
            b.copy_from_slice(src);
            b
        });
        let data: &[u8] = copy.as_deref().unwrap_or(src);
        // A mirror's parity is its data: nothing to compute.
        let mut pbuf = (k > 1 && m > 0).then(|| self.pool.take(n * m * s));
        if let Some(p) = pbuf.as_mut() {
            for (d, p) in data.chunks(sd).zip(p.chunks_mut(m * s)) {
                let ds: Vec<&[u8]> = d.chunks(s).collect();
                let mut ps: Vec<&mut [u8]> = p.chunks_mut(s).collect();
                self.codec.encode(&ds, &mut ps);
            }
        }
        let mut writes = Vec::with_capacity(n * (k + m));
        for (i, (row, views)) in views.iter().enumerate() {
            let d = &data[i * sd..(i + 1) * sd];
            for (shard, v) in views.iter().enumerate() {
                let (true, Some(drive)) = (v.writable, v.drive.clone()) else { continue };
                let buf: &[u8] = match (shard < k, pbuf.as_ref()) {
                    (true, _) => &d[shard * s..(shard + 1) * s],
                    (false, Some(p)) => &p[(i * m + shard - k) * s..(i * m + shard - k + 1) * s],
                    (false, None) => &d[..s],
                };
                writes.push(IoReq { slot: v.slot, drive, offset: self.drive_offset(*row, 0), buf: IoBuf::Write(buf) });
            }
        }
        let failures = self.run(writes);
        if let Some(p) = pbuf {
            self.pool.give(p);
        }
        if let Some(c) = copy {
            self.pool.give(c);
        }
        for i in 0..n as u64 {
            self.after_write_failures(first + i, &failures)?;
        }
        Ok(())
    }

    /// Writes that failed leave the stripe consistent on the drives that took theirs, so
    /// nothing is redone: the failed drives are marked, and the write stands unless the
    /// group lost more than it tolerates.
    fn after_write_failures(&self, stripe: u64, failures: &[IoFailure]) -> std::result::Result<(), StripeError> {
        if failures.is_empty() {
            return Ok(());
        }
        self.fail_all(failures);
        // A rebuilding drive above its checkpoint holds nothing a reader may use.
        let (_, views) = self.view(stripe);
        let alive = views.iter().filter(|v| v.readable).count();
        if alive < self.geo.k {
            return Err(StripeError::Fatal(
                self.offline_error(&format!("a write to stripe {stripe} lost too many drives")),
            ));
        }
        Ok(())
    }

    // ---------------------------------------------------------------- scrub and rebuild

    /// Read every readable strip of a stripe, take `k` of them as truth, recompute the rest
    /// and compare. Repair rewrites the strips that disagree.
    fn scrub_stripe(&self, stripe: u64, repair: bool, report: &mut ScrubReport) -> Result<()> {
        let (k, m) = (self.geo.k, self.geo.m);
        let s = self.geo.strip_bytes as usize;
        let _guard = self.locks.lock(stripe);
        for _ in 0..=self.geo.drive_count() {
            let (row, views) = self.view(stripe);
            let present: Vec<usize> = (0..k + m).filter(|&x| views[x].readable).collect();
            if present.len() < k {
                report.unchecked += 1;
                return Ok(());
            }
            if m == 0 {
                report.stripes_checked += 1;
                return Ok(());
            }
            let mut read = self.pool.take((k + m) * s);
            let mut reqs = Vec::new();
            for (x, chunk) in read.chunks_mut(s).enumerate() {
                if views[x].readable {
                    reqs.push(IoReq {
                        slot: views[x].slot,
                        drive: views[x].drive.clone().expect("readable shard has a drive"),
                        offset: self.drive_offset(row, 0),
                        buf: IoBuf::Read(chunk),
                    });
                }
            }
            let failures = self.run(reqs);
            if !failures.is_empty() {
                self.fail_all(&failures);
                self.pool.give(read);
                continue;
            }
            // Truth: the first k readable shards (data first). Recompute all data, then
            // all parity, and compare every readable shard that was not an input.
            let mut truth = self.pool.take((k + m) * s);
            let mut bad = self.disagreeing(&read, &present, &present[..k], &mut truth)?;
            report.stripes_checked += 1;
            if !bad.is_empty() {
                report.mismatches += 1;
                // With two or more redundant strips, a single bad strip can be found: the
                // one whose absence makes all the others agree. Then it is rewritten, not
                // the parity (which would bake a corrupt data strip into the stripe).
                if present.len() >= k + 2 {
                    let mut located = Vec::new();
                    let mut candidate = self.pool.take((k + m) * s);
                    for &x in &present {
                        let others: Vec<usize> = present.iter().copied().filter(|&y| y != x).collect();
                        if self.disagreeing(&read, &others, &others[..k], &mut candidate)?.is_empty() {
                            located.push(x);
                            truth.copy_from_slice(&candidate);
                        }
                    }
                    self.pool.give(candidate);
                    if let [x] = located[..] {
                        bad = vec![x];
                        report.located += 1;
                    }
                }
                if repair {
                    let reqs = bad
                        .iter()
                        .map(|&x| IoReq {
                            slot: views[x].slot,
                            drive: views[x].drive.clone().expect("readable shard has a drive"),
                            offset: self.drive_offset(row, 0),
                            buf: IoBuf::Write(&truth[x * s..(x + 1) * s]),
                        })
                        .collect();
                    let failures = self.run(reqs);
                    self.fail_all(&failures);
                    if failures.is_empty() {
                        report.repaired += 1;
                    }
                }
            }
            // A rebuilding drive beyond its checkpoint is rewritten by the rebuild itself.
            self.pool.give(read);
            self.pool.give(truth);
            return Ok(());
        }
        Err(self.offline_error(&format!("drives kept failing while scrubbing stripe {stripe}")))
    }

    /// Rebuild a whole stripe into `truth` from the shards `inputs` of `read` (k strips
    /// each laid out at `shard * strip`), and list the shards of `check` that differ from
    /// it (inputs agree by construction).
    fn disagreeing(&self, read: &[u8], check: &[usize], inputs: &[usize], truth: &mut [u8]) -> Result<Vec<usize>> {
        let (k, s) = (self.geo.k, self.geo.strip_bytes as usize);
        {
            let shards: Vec<&[u8]> = read.chunks(s).collect();
            let (tdata, tpar) = truth.split_at_mut(k * s);
            let mut tdata: Vec<&mut [u8]> = tdata.chunks_mut(s).collect();
            let missing: Vec<usize> = (0..k).filter(|j| !inputs.contains(j)).collect();
            for &j in inputs.iter().filter(|&&j| j < k) {
                tdata[j].copy_from_slice(shards[j]);
            }
            if !missing.is_empty() {
                let dec = self.codec.decoder(inputs, &missing)?;
                let ins: Vec<&[u8]> = dec.inputs().iter().map(|&x| shards[x]).collect();
                let mut outs: Vec<&mut [u8]> =
                    tdata.iter_mut().enumerate().filter(|(j, _)| missing.contains(j)).map(|(_, t)| &mut **t).collect();
                dec.apply(&ins, &mut outs);
            }
            let ds: Vec<&[u8]> = tdata.iter().map(|x| &**x).collect();
            let mut ps: Vec<&mut [u8]> = tpar.chunks_mut(s).collect();
            self.codec.encode(&ds, &mut ps);
        }
        Ok(check
            .iter()
            .copied()
            .filter(|x| !inputs.contains(x) && read[x * s..(x + 1) * s] != truth[x * s..(x + 1) * s])
            .collect())
    }

    /// Rebuild slot `slot` from the others, `REBUILD_STEP_BYTES` per member at a time:
    /// lock the step's stripes, read the survivors of every row in one batch, decode, write
    /// the rebuilt strips in one batch, advance the checkpoint. Foreground writes to the
    /// slot go on meanwhile (the slot is writable); reads use it only below the checkpoint.
    fn rebuild(&self, slot: usize) {
        let geo = self.geo;
        let w = geo.width();
        let (group, member) = (slot / w, slot % w);
        let s = geo.strip_bytes as usize;
        let step_rows = (REBUILD_STEP_BYTES / geo.strip_bytes).max(1);
        let mut last_checkpoint = self.rebuild_row.load(Ordering::Acquire);
        let mut throttle = Throttle::new(self);
        loop {
            let row0 = self.rebuild_row.load(Ordering::Acquire);
            if row0 >= geo.rows {
                break;
            }
            let step_started = Instant::now();
            if self.stop.load(Ordering::Acquire) || self.read_slots()[slot].state != SlotState::Rebuilding {
                return; // close() persists the checkpoint; a failed slot ends the rebuild
            }
            let rows: Vec<u64> = (row0..(row0 + step_rows).min(geo.rows)).collect();
            let guards: Vec<_> = rows.iter().map(|r| self.locks.lock(r * geo.groups as u64 + group as u64)).collect();
            // Plan: per row, the shard to rebuild and the k survivors to read.
            let mut plans = Vec::with_capacity(rows.len());
            for &row in &rows {
                let (_, views) = self.view(row * geo.groups as u64 + group as u64);
                let target = geo.shard_of_member(row, member);
                let inputs: Vec<usize> = (0..w).filter(|&x| x != target && views[x].readable).take(geo.k).collect();
                if inputs.len() < geo.k {
                    // The group is offline; the rebuild resumes from its checkpoint once
                    // the volume is assembled with enough drives again.
                    return;
                }
                plans.push((row, views, target, inputs));
            }
            let mut bufs = self.pool.take(rows.len() * geo.k * s);
            let mut reqs = Vec::with_capacity(rows.len() * geo.k);
            for ((row, views, _, inputs), chunk) in plans.iter().zip(bufs.chunks_mut(geo.k * s)) {
                for (&x, b) in inputs.iter().zip(chunk.chunks_mut(s)) {
                    let v = &views[x];
                    let drive = v.drive.clone().expect("readable shard has a drive");
                    reqs.push(IoReq { slot: v.slot, drive, offset: self.drive_offset(*row, 0), buf: IoBuf::Read(b) });
                }
            }
            throttle.account(reqs.len() as u64 * s as u64);
            let failures = self.queues.run(reqs);
            let mut out = self.pool.take(rows.len() * s);
            let ok = failures.is_empty() && {
                let mut decoded = true;
                for ((_, _, target, inputs), (ins, o)) in
                    plans.iter().zip(bufs.chunks(geo.k * s).zip(out.chunks_mut(s)))
                {
                    match self.codec.decoder(inputs, &[*target]) {
                        Ok(dec) => {
                            let by_shard: Vec<(usize, &[u8])> = inputs.iter().copied().zip(ins.chunks(s)).collect();
                            let ordered: Vec<&[u8]> = dec
                                .inputs()
                                .iter()
                                .map(|x| by_shard.iter().find(|(y, _)| y == x).map(|(_, b)| *b).unwrap_or(&[]))
                                .collect();
                            dec.apply(&ordered, &mut [o]);
                        }
                        Err(_) => decoded = false,
                    }
                }
                decoded
            };
            self.fail_all(&failures);
            let mut write_failures = Vec::new();
            if ok {
                let writes: Vec<IoReq<'_>> = plans
                    .iter()
                    .zip(out.chunks(s))
                    .filter_map(|((row, views, target, _), b)| {
                        let v = &views[*target];
                        v.drive.clone().map(|drive| IoReq {
                            slot: v.slot,
                            drive,
                            offset: self.drive_offset(*row, 0),
                            buf: IoBuf::Write(b),
                        })
                    })
                    .collect();
                throttle.account(writes.len() as u64 * s as u64);
                write_failures = self.queues.run(writes);
                self.fail_all(&write_failures);
                if write_failures.is_empty() {
                    self.rebuild_row.store(row0 + rows.len() as u64, Ordering::Release);
                }
            }
            self.pool.give(bufs);
            self.pool.give(out);
            drop(guards);
            if !ok || !write_failures.is_empty() {
                // A survivor or the new drive failed (now marked): plan the step again, or
                // stop if the slot itself is gone.
                continue;
            }
            let done = self.rebuild_row.load(Ordering::Acquire);
            if done - last_checkpoint >= REBUILD_CHECKPOINT_ROWS && self.checkpoint(slot, done) {
                last_checkpoint = done;
            }
            if !throttle.wait(self, step_started.elapsed()) {
                return;
            }
        }
        // Done: the slot is online on the drives first, then in memory.
        let mut meta = self.lock_meta();
        if meta.rebuild_slot != slot as u16 || self.read_slots()[slot].state != SlotState::Rebuilding {
            return;
        }
        meta.rebuild_slot = NO_SLOT;
        meta.rebuild_row = 0;
        if self.persist_locked(&mut meta, &[(slot, SlotState::Online)]).is_ok() {
            let mut slots = self.write_slots();
            if slots[slot].state == SlotState::Rebuilding {
                slots[slot].state = SlotState::Online;
            }
        }
    }

    /// Record rebuild progress on the drives; only then may reads use those rows.
    fn checkpoint(&self, slot: usize, done: u64) -> bool {
        let mut meta = self.lock_meta();
        if meta.rebuild_slot != slot as u16 {
            return false;
        }
        meta.rebuild_row = done;
        let ok = self.persist_locked(&mut meta, &[]).is_ok();
        if ok {
            self.rebuild_readable.store(done, Ordering::Release);
        }
        ok
    }
}

/// Keeps a rebuild to `recon_prio` percent of the drive bandwidth while clients do IO,
/// and lets it run at full speed when they do not. Bandwidth, not time: on a CPU-bound
/// volume a rebuild's IO threads compete for the same cores as the clients', so only a
/// byte budget bounds what it takes from them.
struct Throttle {
    window_start: Instant,
    fg_at_start: u64,
    mine: u64,
}

/// How long the clients must be silent before the rebuild takes everything.
const THROTTLE_IDLE: Duration = Duration::from_millis(2);
/// The throttle forgets history older than this.
const THROTTLE_WINDOW: Duration = Duration::from_secs(1);

impl Throttle {
    fn new(inner: &Inner) -> Throttle {
        Throttle { window_start: Instant::now(), fg_at_start: inner.foreground_bytes.load(Ordering::Relaxed), mine: 0 }
    }

    fn account(&mut self, bytes: u64) {
        self.mine += bytes;
    }

    /// Wait until the rebuild is within its share of bytes, or has paused long enough to
    /// hold `recon_prio` percent of the time (a floor, so that light client IO cannot starve
    /// a rebuild). False when the volume is stopping.
    fn wait(&mut self, inner: &Inner, step: Duration) -> bool {
        let paused = Instant::now();
        loop {
            if inner.stop.load(Ordering::Acquire) {
                return false;
            }
            let prio = inner.lock_meta().recon_prio.clamp(1, 100) as u64;
            let fg = inner.foreground_bytes.load(Ordering::Relaxed) - self.fg_at_start;
            let time_share_reached = paused.elapsed() * prio as u32 >= step * (100 - prio) as u32;
            if prio >= 100 || self.mine * (100 - prio) <= fg * prio || time_share_reached {
                break;
            }
            let before = inner.foreground_bytes.load(Ordering::Relaxed);
            {
                let g = inner.wake.0.lock().unwrap_or_else(|e| e.into_inner());
                let _ = inner.wake.1.wait_timeout(g, THROTTLE_IDLE);
            }
            if inner.foreground_bytes.load(Ordering::Relaxed) == before {
                // Clients are idle: the bandwidth is the rebuild's.
                *self = Throttle::new(inner);
                break;
            }
        }
        if self.window_start.elapsed() > THROTTLE_WINDOW {
            *self = Throttle::new(inner);
        }
        true
    }
}
