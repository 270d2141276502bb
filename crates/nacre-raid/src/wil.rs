//! The write-intent log: a bitmap of regions that may have writes in flight.
//!
//! A stripe write updates data and parity on several drives; a crash between them leaves
//! parity that disagrees with the data (the RAID write hole). Before the first write to a
//! region, its bit is set on every drive and made durable; after the region has been idle
//! for a whole clean interval, the drives are synced and the bit is cleared. After a crash,
//! assembly resyncs only the regions whose bit is set, instead of the whole volume.
//!
//! A region is `region_stripes` consecutive logical stripes. Bits are persisted a 4 KiB
//! sector at a time; one persist runs at a time, and each writes a snapshot taken under the
//! persist lock, so a later persist always carries every bit an earlier one did.

use std::sync::{Condvar, Mutex};

use crate::align::SECTOR_BYTES;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Region {
    Clean,
    /// Being persisted by some writer; others wait for it.
    Setting,
    Dirty,
}

struct State {
    regions: Vec<Region>,
    inflight: Vec<u32>,
    /// A write began here since the last clean pass.
    used: Vec<bool>,
}

pub struct Wil {
    region_stripes: u64,
    state: Mutex<State>,
    set_done: Condvar,
    persist: Mutex<()>,
}

/// What a clean pass or a set asks the volume to write: sectors of the bitmap.
pub struct BitmapWrite {
    /// Sector index within the bitmap area.
    pub sector: u64,
    pub bytes: Vec<u8>,
}

impl Wil {
    /// A log of `bits` regions of `region_stripes` stripes each, all clean in memory (the
    /// volume resyncs and clears what the drives' bitmaps say before writing).
    pub fn new(region_stripes: u64, bits: u64) -> Wil {
        let n = bits as usize;
        Wil {
            region_stripes,
            state: Mutex::new(State { regions: vec![Region::Clean; n], inflight: vec![0; n], used: vec![false; n] }),
            set_done: Condvar::new(),
            persist: Mutex::new(()),
        }
    }

    pub fn region_of(&self, stripe: u64) -> usize {
        (stripe / self.region_stripes) as usize
    }

    fn sector_bytes(regions: &[Region], sector: u64) -> Vec<u8> {
        let bits_per_sector = (SECTOR_BYTES * 8) as u64;
        let mut bytes = vec![0u8; SECTOR_BYTES];
        let first = sector * bits_per_sector;
        for (i, r) in regions.iter().enumerate().skip(first as usize).take(bits_per_sector as usize) {
            if *r != Region::Clean {
                let bit = i as u64 - first;
                bytes[(bit / 8) as usize] |= 1 << (bit % 8);
            }
        }
        bytes
    }

    /// Mark a write to `stripe` as started; `persist` is called (with the bitmap sector to
    /// write durably on every drive) when the region was clean. Returns the region to pass
    /// to [`Wil::end`].
    pub fn begin<E>(&self, stripe: u64, persist: impl FnOnce(BitmapWrite) -> Result<(), E>) -> Result<usize, E> {
        let r = self.region_of(stripe);
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.inflight[r] += 1;
        st.used[r] = true;
        loop {
            match st.regions[r] {
                Region::Dirty => return Ok(r),
                Region::Setting => st = self.set_done.wait(st).unwrap_or_else(|e| e.into_inner()),
                Region::Clean => {
                    st.regions[r] = Region::Setting;
                    drop(st);
                    let result = {
                        let _p = self.persist.lock().unwrap_or_else(|e| e.into_inner());
                        let sector = r as u64 / (SECTOR_BYTES * 8) as u64;
                        let bytes = {
                            let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                            Self::sector_bytes(&st.regions, sector)
                        };
                        persist(BitmapWrite { sector, bytes })
                    };
                    let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    match result {
                        Ok(()) => st.regions[r] = Region::Dirty,
                        Err(e) => {
                            st.regions[r] = Region::Clean;
                            st.inflight[r] -= 1;
                            self.set_done.notify_all();
                            return Err(e);
                        }
                    }
                    self.set_done.notify_all();
                    return Ok(r);
                }
            }
        }
    }

    pub fn end(&self, region: usize) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.inflight[region] -= 1;
        // A write that ends after a clean pass's sync may not be durable yet: the region
        // must stay marked until a later pass has synced after it.
        st.used[region] = true;
    }

    /// Clear regions idle since the previous pass. `sync` must make all completed data
    /// writes durable; it runs before any bit is cleared. `write` persists the sectors.
    /// Returns the number of regions cleared.
    pub fn clean_pass<E>(
        &self,
        all: bool,
        sync: impl FnOnce() -> Result<(), E>,
        write: impl FnOnce(Vec<BitmapWrite>) -> Result<(), E>,
    ) -> Result<usize, E> {
        let _p = self.persist.lock().unwrap_or_else(|e| e.into_inner());
        {
            let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if !st.regions.contains(&Region::Dirty) {
                return Ok(0);
            }
        }
        sync()?;
        let (writes, cleared) = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let mut sectors = Vec::new();
            let mut cleared = 0;
            for r in 0..st.regions.len() {
                let idle = st.inflight[r] == 0 && (all || !st.used[r]);
                if st.regions[r] == Region::Dirty && idle {
                    st.regions[r] = Region::Clean;
                    cleared += 1;
                    let sector = r as u64 / (SECTOR_BYTES * 8) as u64;
                    if sectors.last() != Some(&sector) {
                        sectors.push(sector);
                    }
                }
                st.used[r] = false;
            }
            let writes: Vec<BitmapWrite> = sectors
                .into_iter()
                .map(|sector| BitmapWrite { sector, bytes: Self::sector_bytes(&st.regions, sector) })
                .collect();
            (writes, cleared)
        };
        if !writes.is_empty() {
            write(writes)?;
        }
        Ok(cleared)
    }

    /// Regions currently marked (for status and tests).
    pub fn dirty_regions(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.regions.iter().filter(|r| **r != Region::Clean).count()
    }

    /// Bits set in an on-disk bitmap.
    pub fn set_bits(bitmap: &[u8], bits: u64) -> Vec<u64> {
        (0..bits).filter(|&i| bitmap.get((i / 8) as usize).is_some_and(|b| b & (1 << (i % 8)) != 0)).collect()
    }
}
