//! OST object pools: the precreated objects each OST lends this MDT, a new file's
//! objects taken from them, and the destroy log of removed files' objects.

use super::*;

/// Ranges one OST's pool keeps at most (each one precreate batch).
pub(super) const POOL_RANGES_MAX: usize = 64;

/// How far past an OST's high-water mark a replayed create may name an object: as many
/// objects as a full pool holds (a client's first answer is not trusted beyond that).
const CLAIM_PAST_MAX: u64 = POOL_RANGES_MAX as u64 * 1024;

/// Longer than replays last (a recovery ends by `recovery_time_hard`, 225 s by default).
const REPLAYS_MAX: std::time::Duration = std::time::Duration::from_secs(3600);

/// How long after replays end new files wait for the pools to refill
/// ([`Namespace::objects_ready`]).
pub const REFILL_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

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
    /// Objects at or past `from` (see [`Pools::fresh_from`]) not yet given to a file.
    pub(super) fn available_from(&self, from: u64) -> u64 {
        self.ranges.iter().map(|&(a, b)| b - a.max(from).min(b)).sum()
    }

    /// The first object at or past `from`. Ranges never straddle `from` (it is always
    /// where one range ends and the next begins), so this takes a range's front.
    pub(super) fn take_from(&mut self, from: u64) -> Option<u64> {
        let i = self.ranges.iter().position(|&(a, _)| a >= from)?;
        let (next, end) = &mut self.ranges[i];
        let oid = *next;
        *next += 1;
        if *next >= *end {
            self.ranges.remove(i);
        }
        Some(oid)
    }

    /// Take `oid` for a replayed create that was given it before a restart. Objects are
    /// given in order, so every object of the pool before it was given before it too (to
    /// a create that was lost, or replayed already): those are returned, for the
    /// destroy log. An object past the high-water mark was made by a precreate whose
    /// record the restart lost (the OST makes objects in order): it is taken, and those
    /// between the mark and it go too. None if `oid` is below the mark and not in the
    /// pool (another file has it).
    pub(super) fn claim(&mut self, oid: u64) -> Option<Vec<(u64, u64)>> {
        if oid >= self.high {
            let mut passed: Vec<(u64, u64)> = self.ranges.drain(..).collect();
            if self.high < oid {
                passed.push((self.high, oid));
            }
            self.high = oid.saturating_add(1);
            return Some(passed);
        }
        let i = self.ranges.iter().position(|&(a, b)| a <= oid && oid < b)?;
        let mut passed: Vec<(u64, u64)> = self.ranges.drain(..i).collect();
        let (next, end) = &mut self.ranges[0];
        if *next < oid {
            passed.push((*next, oid));
        }
        *next = oid + 1;
        if *next >= *end {
            self.ranges.pop_front();
        }
        Some(passed)
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
///
/// After a restart the objects the pools held (and the orphans found above them) may have
/// been given to creates the restart lost: a replay of such a create claims its objects
/// back, and the rest are destroyed once replays are over, as Lustre destroys an OST's
/// orphans after recovery. Until then new files take only objects precreated since, at or
/// past `fresh_from`.
#[derive(Debug, Clone, Default)]
pub(super) struct Pools {
    pub(super) osts: BTreeMap<u32, PoolState>,
    pub(super) rr: u64,
    /// Per OST, where the objects made since this start begin (in memory only: after
    /// the next restart all are from before it). An OST missing has none from before.
    pub(super) fresh_from: BTreeMap<u32, u64>,
    /// Replays may still claim objects from before this start.
    pub(super) replaying: bool,
    /// `fresh_from` is set for this start ([`Namespace::expect_replays`] ran).
    pub(super) marked: bool,
}

impl Pools {
    /// Where new files may take objects of `ost` from.
    fn fresh(&self, ost: u32) -> u64 {
        self.fresh_from.get(&ost).copied().unwrap_or(0)
    }

    fn available(&self, ost: u32) -> u64 {
        self.osts.get(&ost).map_or(0, |p| p.available_from(self.fresh(ost)))
    }
}

impl Tx<'_> {
    /// Give a file's striped components that begin before byte `upto` and have no
    /// objects yet their OST objects: for each, its stripe count of objects on
    /// consecutive OSTs from its starting one (round-robin when it has none), more than
    /// one per OST only when overstriping. `have` is what the file has already (empty for
    /// a new file). The other components stay without objects until a write reaches them
    /// (a layout intent), as Lustre instantiates PFL components: a new file gets objects
    /// only for the component that holds its byte 0, so a small file whose first
    /// component is on the MDT takes none. Without OSTs attached a file has a layout and
    /// no objects.
    ///
    /// `None`: nothing to give (no OST, or no such component). It checks before it
    /// takes: on an error nothing is taken. The objects are written with
    /// [`Tx::put_objects`].
    pub(super) fn instantiate(&self, l: &Layout, have: &FileObjects, upto: u64) -> Result<Option<FileObjects>> {
        let mut pools = self.pools.borrow_mut();
        let osts: Vec<u32> = pools.osts.keys().copied().collect();
        let missing = |i: usize| have.get(i).is_none_or(Vec::is_empty);
        let wanted = |i: usize, c: &nacre_proto::layout::Component| {
            matches!(c.kind, Kind::Stripes(_)) && c.start < upto && missing(i)
        };
        if osts.is_empty() || !l.components.iter().enumerate().any(|(i, c)| wanted(i, c)) {
            return Ok(None);
        }
        // Free placement (no starting OST) uses the OSTs that have objects, as Lustre
        // skips inactive OSTs; a starting OST is taken as asked.
        let ready: Vec<u32> = osts.iter().copied().filter(|&o| pools.available(o) > 0).collect();
        let mut objects: FileObjects = Vec::with_capacity(l.components.len());
        let mut want: Vec<(usize, u32)> = Vec::new();
        for (i, c) in l.components.iter().enumerate() {
            let Kind::Stripes(s) = &c.kind else {
                objects.push(Vec::new());
                continue;
            };
            if !wanted(i, c) {
                objects.push(have.get(i).cloned().unwrap_or_default());
                continue;
            }
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
        let total = want.len() + have.iter().map(Vec::len).sum::<usize>();
        if total > nacre_proto::layout::STRIPE_COUNT_MAX as usize {
            return Err(MdError::new(
                errno::EINVAL,
                format!(
                    "layout asks for {total} objects; a file has at most {}",
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
            let have = pools.available(*ost);
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
            let from = pools.fresh(ost);
            let oid = pools
                .osts
                .get_mut(&ost)
                .and_then(|p| p.take_from(from))
                .ok_or_else(|| storage("object pool emptied"))?;
            objects[comp].push((ost, oid));
            self.pools_changed.borrow_mut().insert(ost);
        }
        Ok(Some(objects))
    }

    /// A replayed create's objects, as its first answer gave them: taken back from the
    /// pools (see [`Pools`]), with the objects given before them (to creates lost and not
    /// replayed) queued for destruction. EEXIST if one is not in its pool any more: it
    /// is another file's, and sharing it would mix two files' data.
    pub(super) fn claim(&self, objects: &FileObjects) -> Result<FileObjects> {
        let mut pools = self.pools.borrow_mut();
        if !pools.replaying {
            return Err(MdError::new(errno::EINVAL, "a replayed create names objects after replays ended"));
        }
        for &(ost, oid) in objects.iter().flatten() {
            let high = pools.osts.get(&ost).map_or(0, |p| p.high);
            if oid.saturating_sub(high) > CLAIM_PAST_MAX {
                return Err(MdError::new(
                    errno::EINVAL,
                    format!(
                        "a replayed create names object {oid} of OST {ost}, far past the last this MDT made there ({high})"
                    ),
                ));
            }
            if oid >= pools.fresh(ost) && oid < high {
                return Err(MdError::new(
                    errno::EEXIST,
                    format!("a replayed create's object {oid} of OST {ost} was made after the restart"),
                ));
            }
            let high_before = pools.osts.get(&ost).map_or(0, |p| p.high);
            let passed = pools.osts.get_mut(&ost).and_then(|p| p.claim(oid)).ok_or_else(|| {
                MdError::new(
                    errno::EEXIST,
                    format!("a replayed create's object {oid} of OST {ost} is not free any more (another file's)"),
                )
            })?;
            for (a, b) in passed {
                for gone in a..b {
                    self.put_destroy(ost, gone);
                }
            }
            // Claimed past the mark: everything recorded went, and objects from the new
            // mark on are fresh.
            let high = pools.osts.get(&ost).map_or(0, |p| p.high);
            if high != high_before {
                pools.fresh_from.insert(ost, high);
            }
            self.pools_changed.borrow_mut().insert(ost);
        }
        Ok(objects.clone())
    }

    /// The OST objects of file `fid`, per component of its layout (empty: none yet).
    fn objects_of(&self, fid: Fid) -> Result<FileObjects> {
        self.m().objects.get(&fid.key()).map(|v| decode_objects(v)).transpose().map(Option::unwrap_or_default)
    }

    /// A replayed layout intent's objects, as its first answer gave them (`first`):
    /// claimed back (see [`Tx::claim`]) for the components that begin before `upto` and
    /// have none now. `None`: no such component.
    fn claim_missing(
        &self,
        l: &Layout,
        have: &FileObjects,
        first: &FileObjects,
        upto: u64,
    ) -> Result<Option<FileObjects>> {
        if first.len() != l.components.len() {
            let (c, o) = (l.components.len(), first.len());
            return Err(MdError::new(
                errno::EINVAL,
                format!("a replayed layout intent names objects for {o} components of {c}"),
            ));
        }
        let mut claim: FileObjects = vec![Vec::new(); l.components.len()];
        for (i, c) in l.components.iter().enumerate() {
            if c.start < upto && have.get(i).is_none_or(Vec::is_empty) {
                claim[i] = first[i].clone();
            }
        }
        if claim.iter().all(Vec::is_empty) {
            return Ok(None);
        }
        self.claim(&claim)?;
        let mut objects = claim;
        for (i, o) in have.iter().enumerate() {
            if !o.is_empty() {
                objects[i] = o.clone();
            }
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
    /// Give the striped components of file `fid` that begin before byte `end` their
    /// OST objects, if they have none (see [`Namespace::layout_intent_change`]).
    pub fn layout_intent(&self, cred: &Cred, fid: Fid, end: u64, key: Option<ReplyKey>) -> Result<()> {
        self.change(key, Self::layout_intent_change(cred, fid, end, false))?;
        Ok(())
    }

    /// The change a layout intent makes ([`nacre_proto::mdt::Request::LayoutIntent`]): the
    /// components of regular file `fid`'s layout that begin before byte `end` get their
    /// OST objects if they have none yet; a replay gets back those its first run gave.
    /// `through`: the caller writes through a handle it opened for writing (permission
    /// was checked at open); otherwise it needs write permission now.
    pub fn layout_intent_change(cred: &Cred, fid: Fid, end: u64, through: bool) -> Change {
        let cred = cred.clone();
        Box::new(move |tx| {
            let (a, _) = tx.get(fid)?;
            if !mode::is_reg(a.mode) {
                return Err(MdError::new(errno::EINVAL, format!("{fid} is not a regular file: it has no objects")));
            }
            if !through && !tx.permits(&cred, &a, W) {
                return Err(denied(&cred, "write", &a));
            }
            let l = tx.layout_of(fid)?.ok_or_else(|| MdError::new(errno::EINVAL, format!("{fid} has no layout")))?;
            let have = tx.objects_of(fid)?;
            let objects = match tx.replay_objects.take() {
                Some((_, first)) => tx.claim_missing(&l, &have, &first, end)?,
                None => tx.instantiate(&l, &have, end)?,
            };
            if let Some(o) = &objects {
                tx.put_objects(fid, o)?;
            }
            Ok(Answer::Done)
        })
    }

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

    /// Replays are coming (this MDT restarted and waits for its clients): the objects
    /// its pools hold now are kept for them, and new files take only objects precreated
    /// from now on (see [`Pools`]), until [`Namespace::end_replays`].
    ///
    /// The first call of this start marks the objects from before it; a later one (a
    /// second server over the same namespace) changes nothing.
    pub fn expect_replays(&self) {
        let _m = write(&self.mem);
        let mut pools = lock(&self.pools);
        if pools.marked {
            return;
        }
        pools.marked = true;
        pools.replaying = true;
        pools.fresh_from = pools.osts.iter().map(|(o, p)| (*o, p.high)).collect();
        // New creates wait for the refill from now until after replays end: one let in
        // as recovery ends, before `end_replays`, finds only objects kept for replays.
        *lock(&self.refill_until) = Some(std::time::Instant::now() + REPLAYS_MAX);
    }

    /// Replays are over: the objects from before this start that no replay claimed are
    /// destroyed ([`Namespace::retire_stale`]).
    pub fn end_replays(&self) {
        let _m = write(&self.mem);
        lock(&self.pools).replaying = false;
        *lock(&self.refill_until) = Some(std::time::Instant::now() + REFILL_WAIT);
    }

    /// Wait while an attached OST has no object for a new file, while replays run and for
    /// a while after they end (not for replays themselves: they claim their objects):
    /// the pools held only objects from before the restart, and the precreates that
    /// refill them take a round trip to each OSS. A create then waits for them
    /// rather than fail with ENOSPC (as Lustre's MDS waits for its OSP's precreates).
    /// Once every pool has objects, or [`REFILL_WAIT`] has passed (an OST that does not
    /// answer is skipped by free placement), this returns at once.
    pub async fn objects_ready(&self) {
        loop {
            let Some(until) = *lock(&self.refill_until) else { return };
            let (attached, short) = {
                let p = lock(&self.pools);
                (!p.osts.is_empty(), p.osts.keys().any(|&o| p.available(o) == 0))
            };
            if !attached {
                // No OSTs (yet): files get no objects, and nothing to wait for.
                return;
            }
            if !short || std::time::Instant::now() >= until {
                *lock(&self.refill_until) = None;
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Does OST `ost`'s pool still hold objects from before this start that replays are
    /// done with?
    pub fn has_stale(&self, ost: u32) -> bool {
        let pools = lock(&self.pools);
        let from = pools.fresh(ost);
        !pools.replaying && pools.osts.get(&ost).is_some_and(|p| p.ranges.front().is_some_and(|&(a, _)| a < from))
    }

    /// Queue up to 4,096 of OST `ost`'s objects from before this start that no replay
    /// claimed for destruction, in one change. Returns true while some remain.
    pub fn retire_stale(&self, ost: u32) -> Result<bool> {
        let more = self.change(
            None,
            Box::new(move |tx| {
                let mut pools = tx.pools.borrow_mut();
                let from = pools.fresh(ost);
                if pools.replaying {
                    return Ok(Answer::Done);
                }
                let Some(p) = pools.osts.get_mut(&ost) else { return Ok(Answer::Done) };
                let mut budget = 4096u64;
                while budget > 0
                    && let Some((a, b)) = p.ranges.front_mut()
                    && *a < from
                {
                    let upto = (*b).min(a.saturating_add(budget));
                    for oid in *a..upto {
                        tx.put_destroy(ost, oid);
                    }
                    budget -= upto - *a;
                    *a = upto;
                    if *a >= *b {
                        p.ranges.pop_front();
                    }
                }
                tx.pools_changed.borrow_mut().insert(ost);
                let left = p.ranges.front().is_some_and(|&(a, _)| a < from);
                Ok(if left { Answer::Attr(Attr::default()) } else { Answer::Done })
            }),
        )?;
        Ok(matches!(more, Answer::Attr(_)))
    }

    /// Reclaim OST `ost`'s orphans below `next` (its next object id): the objects from the
    /// end of the last range this MDT recorded up to `next`, made for precreates whose
    /// answer was lost (or recorded by a change a restart lost, whose files replays may
    /// claim). While replays are expected they join the pool as objects from before
    /// this start (see [`Pools`]); otherwise at most 4,096 per call go to the destroy log.
    /// Either way the high-water mark rises past them, in one change, so a precreate
    /// answer that arrives late can no longer add them to the pool. Returns true while
    /// some remain. An OST this MDT never precreated on is left alone.
    ///
    /// This assumes one MDT creates on the OST; with several (DNE), each needs its own
    /// object sequence there, as in Lustre.
    pub fn reclaim_orphans(&self, ost: u32, next: u64) -> Result<bool> {
        let more = self.change(
            None,
            Box::new(move |tx| {
                let mut pools = tx.pools.borrow_mut();
                let (replaying, pools_fresh) = (pools.replaying, pools.fresh(ost));
                let Some(p) = pools.osts.get_mut(&ost) else { return Ok(Answer::Done) };
                if p.high == 0 || p.high >= next {
                    return Ok(Answer::Done);
                }
                // Only while every object recorded is from before this start: orphans
                // above objects precreated since are this start's own, and go.
                let stale_only = p.high <= pools_fresh;
                if replaying && stale_only && p.ranges.len() < POOL_RANGES_MAX {
                    p.ranges.push_back((p.high, next));
                    p.high = next;
                    pools.fresh_from.insert(ost, next);
                    tx.pools_changed.borrow_mut().insert(ost);
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

    /// Each attached OST and how many precreated objects its pool holds for new files.
    pub fn pool_levels(&self) -> Vec<(u32, u64)> {
        let pools = lock(&self.pools);
        pools.osts.keys().map(|&o| (o, pools.available(o))).collect()
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
                let (replaying, fresh) = (pools.replaying, pools.fresh(ost));
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
                // Objects between the mark and this batch, while all recorded are from
                // before this start, were made for a precreate whose record the restart
                // lost: replays may claim them, new files may not.
                let gap = replaying && p.high > 0 && p.high <= fresh && first > p.high;
                if gap && p.ranges.len() + 1 < POOL_RANGES_MAX {
                    p.ranges.push_back((p.high, first));
                }
                p.ranges.push_back((first, first + count));
                p.high = p.high.max(first + count);
                if gap {
                    pools.fresh_from.insert(ost, first);
                }
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
