//! OST object pools: the precreated objects each OST lends this MDT, a new file's
//! objects taken from them, and the destroy log of removed files' objects.

use super::*;

/// Ranges one OST's pool keeps at most (each one precreate batch).
pub(super) const POOL_RANGES_MAX: usize = 64;

/// One OST's precreated objects not yet given to a file: ranges `[next, end)`, oldest
/// first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolState {
    pub ranges: std::collections::VecDeque<(u64, u64)>,
    /// The end of the last range ever added: objects of this OST at or past it were never
    /// recorded here (orphans of a precreate whose answer was lost).
    pub high: u64,
}

impl PoolState {
    pub fn available(&self) -> u64 {
        self.ranges.iter().map(|(a, b)| b - a).sum()
    }

    pub(super) fn take(&mut self) -> Option<u64> {
        let (next, end) = self.ranges.front_mut()?;
        let oid = *next;
        *next += 1;
        if *next >= *end {
            self.ranges.pop_front();
        }
        Some(oid)
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut e = Enc::new(1).u32(self.ranges.len() as u32);
        for (a, b) in &self.ranges {
            e = e.u64(*a).u64(*b);
        }
        e.u64(self.high).done()
    }

    pub(super) fn decode(b: &[u8]) -> Result<PoolState> {
        let mut d = nacre_proto::wire::Dec::new(b, "object pool", 1)?;
        let n = d.u32("range count")? as usize;
        if n > POOL_RANGES_MAX {
            return Err(storage(format!("object pool of {n} ranges")));
        }
        let mut ranges = std::collections::VecDeque::with_capacity(n);
        for _ in 0..n {
            ranges.push_back((d.u64("range start")?, d.u64("range end")?));
        }
        let high = d.u64("high water")?;
        d.end()?;
        Ok(PoolState { ranges, high })
    }
}

/// A file's objects: per component, (OST index, object id) per stripe.
pub type FileObjects = Vec<Vec<(u32, u64)>>;

pub(super) fn encode_objects(o: &FileObjects) -> Vec<u8> {
    let mut e = Enc::new(1).u32(o.len() as u32);
    for c in o {
        e = e.u32(c.len() as u32);
        for (ost, oid) in c {
            e = e.u32(*ost).u64(*oid);
        }
    }
    e.done()
}

pub(super) fn decode_objects(b: &[u8]) -> Result<FileObjects> {
    let mut d = nacre_proto::wire::Dec::new(b, "file objects", 1)?;
    let n = d.u32("component count")? as usize;
    if n > nacre_proto::layout::COMPONENTS_MAX {
        return Err(storage(format!("objects of {n} components")));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let m = d.u32("stripe count")? as usize;
        if m > nacre_proto::layout::STRIPE_COUNT_MAX as usize {
            return Err(storage(format!("{m} stripes in one component")));
        }
        let mut c = Vec::with_capacity(m);
        for _ in 0..m {
            c.push((d.u32("OST")?, d.u64("object")?));
        }
        out.push(c);
    }
    d.end()?;
    Ok(out)
}

/// The OSTs files get objects on: their pools, and where round-robin placement is.
#[derive(Debug, Clone, Default)]
pub(super) struct Pools {
    pub(super) osts: BTreeMap<u32, PoolState>,
    pub(super) rr: u64,
}

impl Tx<'_> {
    /// Give a new file its OST objects: for each striped component, its stripe count
    /// of objects on consecutive OSTs from its starting one (round-robin when it has
    /// none), more than one per OST only when overstriping. Without OSTs attached a file
    /// has a layout and no objects.
    ///
    /// It checks before it takes: on an error nothing is taken. The objects are written
    /// with [`Tx::put_objects`].
    pub(super) fn instantiate(&self, l: &Layout) -> Result<Option<FileObjects>> {
        let mut pools = self.pools.borrow_mut();
        let osts: Vec<u32> = pools.osts.keys().copied().collect();
        if osts.is_empty() {
            return Ok(None);
        }
        // Free placement (no starting OST) uses the OSTs that have objects, as Lustre
        // skips inactive OSTs; a starting OST is taken as asked.
        let ready: Vec<u32> =
            osts.iter().copied().filter(|o| pools.osts.get(o).is_some_and(|p| p.available() > 0)).collect();
        let mut objects: FileObjects = Vec::with_capacity(l.components.len());
        let mut want: Vec<(usize, u32)> = Vec::new();
        for c in &l.components {
            let Kind::Stripes(s) = &c.kind else {
                objects.push(Vec::new());
                continue;
            };
            let in_pool: Vec<u32>;
            let mut list: &[u32] = if s.offset < 0 && !ready.is_empty() { &ready } else { &osts };
            if let Some(p) = &s.pool {
                let members = self.ns.pool_osts(p)?;
                in_pool = list.iter().copied().filter(|o| members.contains(o)).collect();
                if in_pool.is_empty() {
                    return Err(MdError::new(
                        errno::ENOSPC,
                        format!("pool {p} has no OST this MDT has objects on (it lists {members:?})"),
                    ));
                }
                list = &in_pool;
            }
            let m = list.len() as u64;
            let count = match s.count {
                -1 => m,
                c if s.overstripe => c.max(1) as u64,
                c => (c.max(1) as u64).min(m),
            };
            let start = if s.offset >= 0 {
                list.iter().position(|&o| o == s.offset as u32).ok_or_else(|| {
                    MdError::new(
                        errno::EINVAL,
                        format!("layout starts on OST {}, which this file system does not have", s.offset),
                    )
                })? as u64
            } else {
                let at = pools.rr % m;
                pools.rr = pools.rr.wrapping_add(1);
                at
            };
            objects.push(Vec::with_capacity(count as usize));
            for i in 0..count {
                want.push((objects.len() - 1, list[((start + i) % m) as usize]));
            }
        }
        if want.len() > nacre_proto::layout::STRIPE_COUNT_MAX as usize {
            return Err(MdError::new(
                errno::EINVAL,
                format!(
                    "layout asks for {} objects; a file has at most {}",
                    want.len(),
                    nacre_proto::layout::STRIPE_COUNT_MAX
                ),
            ));
        }
        // Check every pool has what is asked before taking anything.
        let mut need: BTreeMap<u32, u64> = BTreeMap::new();
        for &(_, ost) in &want {
            *need.entry(ost).or_default() += 1;
        }
        for (ost, k) in &need {
            let have = pools.osts.get(ost).map_or(0, PoolState::available);
            if have < *k {
                return Err(MdError::new(
                    errno::ENOSPC,
                    format!(
                        "OST {ost} has {have} precreated objects and the file needs {k} (precreate is catching up)"
                    ),
                ));
            }
        }
        for (comp, ost) in want {
            let oid =
                pools.osts.get_mut(&ost).and_then(PoolState::take).ok_or_else(|| storage("object pool emptied"))?;
            objects[comp].push((ost, oid));
            self.pools_changed.borrow_mut().insert(ost);
        }
        Ok(Some(objects))
    }

    pub(super) fn put_objects(&self, fid: Fid, objects: &FileObjects) -> Result<()> {
        self.apply(Op::Objects(fid.key(), Some(encode_objects(objects).into())));
        Ok(())
    }

    /// Queue OST object `oid` of `ost` for destruction.
    pub(super) fn put_destroy(&self, ost: u32, oid: u64) {
        self.apply(Op::Destroy(ost, oid, true));
    }
}

impl Namespace {
    /// The OST pools as the MGS defines them (`lov.pool.NAME` parameters): layouts may
    /// name only these, and their objects go only to their OSTs.
    pub fn set_ost_pools(&self, pools: BTreeMap<String, Vec<u32>>) {
        *lock(&self.ost_pools) = Some(pools);
    }

    /// The OSTs of pool `name`; EINVAL if there is no such pool.
    pub(super) fn pool_osts(&self, name: &str) -> Result<Vec<u32>> {
        match &*lock(&self.ost_pools) {
            None => Err(MdError::new(
                errno::EINVAL,
                format!("layout names pool {name:?}, and this MDT has no pools (they come from the MGS)"),
            )),
            Some(p) => p.get(name).cloned().ok_or_else(|| {
                let known: Vec<&String> = p.keys().collect();
                MdError::new(
                    errno::EINVAL,
                    format!(
                        "layout names pool {name:?}, which is not defined (pools: {known:?}; lov.pool.NAME on the MGS)"
                    ),
                )
            }),
        }
    }

    /// EINVAL unless every pool `l` names exists.
    pub(super) fn check_pools(&self, l: &Layout) -> Result<()> {
        for c in &l.components {
            if let Kind::Stripes(Striping { pool: Some(p), .. }) = &c.kind {
                self.pool_osts(p)?;
            }
        }
        Ok(())
    }

    /// Give new files objects on these OSTs (from now on). An OST's pool starts empty and
    /// fills as precreated objects are added ([`Namespace::add_precreated`]).
    ///
    /// Attaching goes through group commit like any change, so no batch running at the
    /// same time can drop it, and it is recorded: a restart finds the OSTs attached.
    pub fn attach_osts(&self, osts: &[u32]) -> Result<()> {
        let osts = osts.to_vec();
        self.change(
            None,
            Box::new(move |tx| {
                let mut pools = tx.pools.borrow_mut();
                for o in osts {
                    if let std::collections::btree_map::Entry::Vacant(e) = pools.osts.entry(o) {
                        e.insert(PoolState::default());
                        tx.pools_changed.borrow_mut().insert(o);
                    }
                }
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// Objects `[first, first + count)` of OST `ost` were made but will not be used (they
    /// could not be added to its pool): queue them for destruction.
    pub fn discard_objects(&self, ost: u32, first: u64, count: u64) -> Result<()> {
        if count > 1 << 16 || first.checked_add(count).is_none() {
            return Err(MdError::new(errno::EINVAL, format!("discarding {count} objects at {first}")));
        }
        self.change(
            None,
            Box::new(move |tx| {
                for oid in first..first + count {
                    tx.put_destroy(ost, oid);
                }
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// Reclaim OST `ost`'s orphans below `next` (its next object id): the objects from the
    /// end of the last range this MDT recorded up to `next`, at most 4,096 per call, go to
    /// the destroy log and the high-water mark rises past them, in one change, so a
    /// precreate answer that arrives late can no longer add them to the pool. Returns
    /// true while some remain. An OST this MDT never precreated on is left alone.
    ///
    /// This assumes one MDT creates on the OST; with several (DNE), each needs its own
    /// object sequence there, as in Lustre.
    pub fn reclaim_orphans(&self, ost: u32, next: u64) -> Result<bool> {
        let more = self.change(
            None,
            Box::new(move |tx| {
                let mut pools = tx.pools.borrow_mut();
                let Some(p) = pools.osts.get_mut(&ost) else { return Ok(Answer::Done) };
                if p.high == 0 || p.high >= next {
                    return Ok(Answer::Done);
                }
                let upto = next.min(p.high.saturating_add(4096));
                for oid in p.high..upto {
                    tx.put_destroy(ost, oid);
                }
                p.high = upto;
                tx.pools_changed.borrow_mut().insert(ost);
                Ok(if upto < next { Answer::Attr(Attr::default()) } else { Answer::Done })
            }),
        )?;
        Ok(matches!(more, Answer::Attr(_)))
    }

    /// Each attached OST and how many precreated objects its pool holds.
    pub fn pool_levels(&self) -> Vec<(u32, u64)> {
        lock(&self.pools).osts.iter().map(|(o, p)| (*o, p.available())).collect()
    }

    /// Objects `[first, first + count)` now exist on OST `ost`: files may take them.
    pub fn add_precreated(&self, ost: u32, first: u64, count: u64) -> Result<()> {
        if count == 0 || first.checked_add(count).is_none() {
            return Err(MdError::new(errno::EINVAL, format!("precreated range {first}+{count}")));
        }
        self.change(
            None,
            Box::new(move |tx| {
                let mut pools = tx.pools.borrow_mut();
                let p = pools
                    .osts
                    .get_mut(&ost)
                    .ok_or_else(|| MdError::new(errno::EINVAL, format!("OST {ost} is not attached")))?;
                if p.ranges.len() >= POOL_RANGES_MAX {
                    return Err(MdError::new(
                        errno::ENOSPC,
                        format!("OST {ost}'s pool holds {POOL_RANGES_MAX} ranges already"),
                    ));
                }
                if first < p.high {
                    return Err(MdError::new(
                        errno::ESTALE,
                        format!("objects {first}+{count} of OST {ost} are below its high-water mark {}: reclaimed as orphans", p.high),
                    ));
                }
                if p.ranges.iter().any(|&(a, b)| first < b && a < first + count) {
                    return Err(MdError::new(
                        errno::EEXIST,
                        format!("objects {first}+{count} of OST {ost} are in its pool already"),
                    ));
                }
                p.ranges.push_back((first, first + count));
                p.high = p.high.max(first + count);
                tx.pools_changed.borrow_mut().insert(ost);
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// A file's OST objects (empty when it has none).
    pub fn objects(&self, fid: Fid) -> Result<FileObjects> {
        self.getattr(fid)?;
        match read(&self.mem).objects.get(&fid.key()) {
            Some(v) => decode_objects(v),
            None => Ok(Vec::new()),
        }
    }

    /// A file's encoded layout (empty: none) and its OST objects, read together, for an
    /// open's reply.
    pub fn layout_and_objects(&self, fid: Fid) -> Result<(Vec<u8>, FileObjects)> {
        let m = read(&self.mem);
        if m.inode(fid.key()).is_none() {
            return Err(MdError::new(errno::ENOENT, format!("no inode {fid}")));
        }
        let layout = m.layout(fid.key()).map(|l| l.to_vec()).unwrap_or_default();
        let objects = match m.objects.get(&fid.key()) {
            Some(v) => decode_objects(v)?,
            None => Vec::new(),
        };
        Ok((layout, objects))
    }

    /// Up to `max` objects of removed files still to destroy, on OST `ost` or on any.
    pub fn pending_destroys(&self, ost: Option<u32>, max: usize) -> Result<Vec<(u32, u64)>> {
        let m = read(&self.mem);
        Ok(match ost {
            Some(o) => m.destroys.range((o, 0)..=(o, u64::MAX)).take(max).copied().collect(),
            None => m.destroys.iter().take(max).copied().collect(),
        })
    }

    /// These objects are destroyed on their OSTs: forget them.
    pub fn destroyed(&self, done: Vec<(u32, u64)>) -> Result<()> {
        if done.is_empty() {
            return Ok(());
        }
        self.change(
            None,
            Box::new(move |tx| {
                for (ost, oid) in done {
                    if tx.m().destroys.contains(&(ost, oid)) {
                        tx.apply(Op::Destroy(ost, oid, false));
                    }
                }
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }
}
