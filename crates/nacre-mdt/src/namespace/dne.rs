//! One MDT's share of operations over several MDTs (DNE): striped directories, the
//! defaults of new subdirectories, the updates another MDT asks of this one, and the
//! intents of the operations this one coordinates.
//!
//! **Intents.** An operation over several MDTs is planned as steps, each one
//! [`Update`] on one MDT with the update that undoes it. The coordinating MDT stores the
//! plan as an intent (in the same transaction as the client's reply record, which then
//! says "intent N") before any step runs; it runs the steps in order, each under a reply
//! key of its own, so that running one twice (after a lost reply, or after a restart)
//! returns its first answer. A step that fails undoes those before it in reverse order;
//! then the intent goes and the client's reply record takes the final answer, in one
//! transaction. After a crash of the coordinator, its open intents are run again from
//! the start: the steps already done answer from their records, so the operation goes
//! the same way and ends whole, done or undone. A crash of another MDT only delays a
//! step (it is sent again until that MDT answers).

use nacre_proto::dne::{DirDefault, DirStripe, Update};
use nacre_proto::fid::Fid;
use nacre_proto::mdt::{errno, mode};
use nacre_proto::wire::{Dec, Enc};

use super::mem::Op;
use super::{
    Answer, Change, Cred, LINK_MAX, MdError, Namespace, ReplyKey, Result, Stored, Tx, check_name, coordinate, may,
    read, storage,
};

/// The first sequence (of the 2^32 of each MDT) handed to other MDTs: MDT `c` makes the
/// FIDs of the inodes it creates on MDT `m` in sequences `seq_of(m, PEER_SEQ_BASE + (c
/// << 15) + j)`, so no MDT asks another for FIDs. An MDT's own sequences count up from 0.
pub const PEER_SEQ_BASE: u32 = 1 << 31;

/// One step of an intent: an update on MDT `mdt`, and the update that undoes it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub mdt: u32,
    pub update: Update,
    pub undo: Option<Update>,
}

/// An operation over several MDTs, as its coordinator stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    pub id: u64,
    /// The client's reply key: its record gets the final answer.
    pub client: Option<ReplyKey>,
    pub steps: Vec<Step>,
    /// The step whose answer is the operation's (`None`: it answers `Done`).
    pub reply: Option<u32>,
}

/// Steps an intent has at most (a striped directory: its master, a shard per MDT, its
/// entry).
pub const STEPS_MAX: usize = nacre_proto::dne::DIR_STRIPES_MAX + 4;

/// Version of a stored intent: 2 since the attributes its steps carry have `rdev`, 3
/// since the credentials they carry have a umask.
const INTENT_VERSION: u8 = 3;

impl Intent {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::new(INTENT_VERSION).u64(self.id);
        e = match &self.client {
            Some(k) => e.u8(1).u64(k.client).u64(k.xid).u64(k.acked_below).u32(k.digest),
            None => e.u8(0),
        };
        e = e.u32(self.reply.map_or(u32::MAX, |r| r)).u32(self.steps.len() as u32);
        for s in &self.steps {
            e = s.update.put(e.u32(s.mdt));
            e = match &s.undo {
                Some(u) => u.put(e.u8(1)),
                None => e.u8(0),
            };
        }
        e.done()
    }

    pub fn decode(b: &[u8]) -> Result<Intent> {
        let mut d = Dec::new(b, "intent", INTENT_VERSION)?;
        let id = d.u64("intent id")?;
        let client = match d.u8("client flag")? {
            0 => None,
            _ => Some(ReplyKey {
                client: d.u64("client")?,
                xid: d.u64("xid")?,
                acked_below: d.u64("acked xid")?,
                digest: d.u32("digest")?,
            }),
        };
        let reply = Some(d.u32("reply step")?).filter(|&r| r != u32::MAX);
        let n = d.u32("step count")? as usize;
        if n > STEPS_MAX {
            return Err(storage(format!("intent of {n} steps")));
        }
        let mut steps = Vec::with_capacity(n);
        for _ in 0..n {
            let mdt = d.u32("step MDT")?;
            let update = Update::get(&mut d)?;
            let undo = match d.u8("undo flag")? {
                0 => None,
                _ => Some(Update::get(&mut d)?),
            };
            steps.push(Step { mdt, update, undo });
        }
        d.end()?;
        Ok(Intent { id, client, steps, reply })
    }
}

/// The reply-key client of the steps MDT `c` coordinates, on every MDT.
pub fn coordinator_client(c: u32) -> u64 {
    0xC00D_0000_0000_0000 | c as u64
}

/// Is `client` the reply-key client of some MDT's steps? Their reply records are kept
/// until the coordinator says their intents ended.
pub fn is_coordinator_client(client: u64) -> bool {
    client >> 32 == 0xC00D_0000
}

impl Tx<'_> {
    /// `NEEDS_COORDINATION` unless `fid` lives on this MDT.
    pub(super) fn local(&self, fid: Fid) -> Result<()> {
        match fid.mdt() {
            Some(m) if m == self.ns.index => Ok(()),
            Some(m) => Err(coordinate(format!("{fid} lives on MDT {m}"))),
            None => Err(MdError::new(errno::ESTALE, format!("{fid} belongs to no MDT"))),
        }
    }

    pub(super) fn dir_stripe(&self, dir: Fid) -> Result<Option<DirStripe>> {
        match self.m().dirstripes.get(&dir.key()) {
            Some(v) => Ok(Some(DirStripe::decode(v)?)),
            None => Ok(None),
        }
    }

    /// EREMOTE if `dir` is striped: names go to its shards, which the client picks.
    pub(super) fn not_striped(&self, dir: Fid) -> Result<()> {
        match self.dir_stripe(dir)? {
            Some(s) => Err(MdError::new(
                errno::EREMOTE,
                format!("{dir} is striped over {} MDTs: its entries are in its shards", s.shards.len()),
            )),
            None => Ok(()),
        }
    }

    fn put_dir_stripe(&self, dir: Fid, v: &[u8]) -> Result<()> {
        self.apply(Op::DirStripe(dir.key(), Some(v.into())));
        Ok(())
    }

    pub(super) fn del_dir_stripe(&self, dir: Fid) -> Result<()> {
        if self.m().dirstripes.contains_key(&dir.key()) {
            self.apply(Op::DirStripe(dir.key(), None));
        }
        Ok(())
    }

    pub(super) fn dir_default_of(&self, dir: Fid) -> Result<Option<DirDefault>> {
        match self.m().dirdefaults.get(&dir.key()) {
            Some(v) => Ok(Some(DirDefault::decode(v)?)),
            None => Ok(None),
        }
    }

    /// Set (or with `None` remove) the default of `dir`'s new subdirectories.
    pub(super) fn set_dir_default(&self, dir: Fid, d: Option<DirDefault>) -> Result<()> {
        match d {
            Some(d) => self.apply(Op::DirDefault(dir.key(), Some(d.encode().into()))),
            None => {
                if self.m().dirdefaults.contains_key(&dir.key()) {
                    self.apply(Op::DirDefault(dir.key(), None));
                }
            }
        }
        Ok(())
    }

    /// A FID for a new inode on MDT `mdt`: this MDT's own allocator for itself, else the
    /// next of the sequences `mdt` leaves to this one ([`PEER_SEQ_BASE`]).
    pub fn fid_on(&mut self, mdt: u32) -> Result<Fid> {
        if mdt == self.ns.index {
            return self.new_fid();
        }
        let key = format!("peer_fid.{mdt}");
        let at = self.meta(&key).unwrap_or(1);
        let (j, oid) = ((at >> 32) as u32, at as u32);
        if j >= 1 << 15 {
            return Err(MdError::new(errno::ENOSPC, format!("FIDs this MDT may make on MDT {mdt} are used up")));
        }
        let next = if oid == u32::MAX { ((j as u64 + 1) << 32) | 1 } else { at + 1 };
        self.put_meta(&key, next)?;
        let k = PEER_SEQ_BASE + (self.ns.index.min((1 << 16) - 1) << 15) + j;
        Ok(Fid::new(Fid::seq_of(mdt, k), oid))
    }

    /// The parent of a new entry `name`, which must not exist, in `dir`, which `cred`
    /// may change: its attributes and its own parent.
    pub fn parent_for_new(&self, cred: &Cred, dir: Fid, name: &str) -> Result<(nacre_proto::mdt::Attr, Fid)> {
        check_name(name)?;
        self.local(dir)?;
        let (d, _) = self.get(dir)?;
        if mode::is_dir(d.mode)
            && self.permits(cred, &d, 1)
            && d.nlink > 0
            && let Some((f, _)) = self.lookup(dir, name)?
        {
            return Err(MdError::new(errno::EEXIST, format!("{name:?} exists in {dir} (as {f})")));
        }
        self.dir_for_change(cred, dir)
    }

    /// The default a new subdirectory of `dir` inherits.
    pub fn inherited_default(&self, dir: Fid) -> Result<Option<DirDefault>> {
        Ok(self.dir_default_of(dir)?.and_then(|d| d.inherited()))
    }

    /// Apply one update another MDT (or this one, coordinating) asks for. It checks
    /// everything before it writes.
    pub(super) fn apply_update(&mut self, u: &Update) -> Result<Answer> {
        match u {
            Update::MakeInode { attr, parent, stripe, default } => {
                self.local(attr.fid)?;
                if self.m().has_inode(attr.fid.key()) {
                    return Err(MdError::new(errno::EEXIST, format!("inode {} exists", attr.fid)));
                }
                let stripe = if stripe.is_empty() { None } else { Some(DirStripe::decode(stripe)?) };
                let default = if default.is_empty() { None } else { Some(DirDefault::decode(default)?) };
                if (stripe.is_some() || default.is_some()) && !mode::is_dir(attr.mode) {
                    return Err(MdError::new(errno::ENOTDIR, format!("{} is not a directory", attr.fid)));
                }
                let mut a = *attr;
                a.ctime_ns = self.now;
                self.put(&a, *parent)?;
                if let Some(s) = stripe {
                    self.put_dir_stripe(a.fid, &s.encode())?;
                }
                self.set_dir_default(a.fid, default)?;
                Ok(Answer::Attr(a))
            }
            Update::AddEntry { creds, dir, name, fid, kind, dlink, replace } => {
                let cred = Cred { uid: creds.uid, gid: creds.gid, groups: creds.groups.clone(), umask: creds.umask };
                check_name(name)?;
                self.local(*dir)?;
                let (d, dp) = self.dir_for_change(&cred, *dir)?;
                let mut dlink = *dlink as i64;
                let victim = match self.lookup(*dir, name)? {
                    None => None,
                    Some(_) if !replace => {
                        return Err(MdError::new(errno::EEXIST, format!("{name:?} exists in {dir}")));
                    }
                    // Two names of one inode: as POSIX's rename, nothing to do.
                    Some((v, _)) if v == *fid => return Ok(Answer::Done),
                    Some((v, _)) => {
                        if v.mdt() != Some(self.ns.index) {
                            return Err(MdError::new(
                                errno::EXDEV,
                                format!("{name:?} in {dir} names {v} on another MDT: remove it first"),
                            ));
                        }
                        let (va, vp) = self.get(v)?;
                        let v_dir = mode::is_dir(va.mode);
                        let is_dir = mode::is_dir(*kind);
                        if is_dir && !v_dir {
                            return Err(MdError::new(errno::ENOTDIR, format!("{name:?} is not a directory")));
                        }
                        if !is_dir && v_dir {
                            return Err(MdError::new(errno::EISDIR, format!("{name:?} is a directory")));
                        }
                        if v_dir && (!self.dir_is_empty(v)? || self.dir_stripe(v)?.is_some()) {
                            return Err(MdError::new(errno::ENOTEMPTY, format!("directory {name:?} is not empty")));
                        }
                        if !Tx::sticky_ok(&cred, &d, &va) {
                            return Err(MdError::new(
                                errno::EPERM,
                                format!("{name:?} is in a sticky directory and not yours"),
                            ));
                        }
                        if v_dir {
                            dlink -= 1;
                        }
                        Some((va, vp))
                    }
                };
                if dlink > 0 && d.nlink >= LINK_MAX {
                    return Err(MdError::new(errno::EMLINK, format!("{dir} has {LINK_MAX} links")));
                }
                if let Some((va, vp)) = victim {
                    self.remove_entry(*dir, name)?;
                    self.drop_link(va, vp)?;
                }
                self.add_entry(*dir, name, *fid, *kind & mode::S_IFMT)?;
                self.touch_dir(d, dp, dlink)?;
                Ok(Answer::Done)
            }
            Update::DelEntry { creds, dir, name, fid, kind, owner, dlink } => {
                let cred = Cred { uid: creds.uid, gid: creds.gid, groups: creds.groups.clone(), umask: creds.umask };
                self.local(*dir)?;
                let (d, dp) = self.dir_for_change(&cred, *dir)?;
                match self.lookup(*dir, name)? {
                    Some((f, _)) if f == *fid => {}
                    _ => return Err(MdError::new(errno::ENOENT, format!("no {name:?} naming {fid} in {dir}"))),
                }
                let victim = nacre_proto::mdt::Attr { fid: *fid, mode: *kind, uid: *owner, ..Default::default() };
                if !Tx::sticky_ok(&cred, &d, &victim) {
                    return Err(MdError::new(errno::EPERM, format!("{name:?} is in a sticky directory and not yours")));
                }
                self.remove_entry(*dir, name)?;
                self.touch_dir(d, dp, *dlink as i64)?;
                Ok(Answer::Done)
            }
            Update::Link { fid, delta } => {
                self.local(*fid)?;
                if *delta < 0 && !self.m().has_inode(fid.key()) {
                    // Its last name went, and so did it: nothing to drop.
                    return Ok(Answer::Done);
                }
                let (mut a, p) = self.get(*fid)?;
                if mode::is_dir(a.mode) {
                    return Err(MdError::new(errno::EPERM, format!("{fid} is a directory: no hard links")));
                }
                if *delta < 0 {
                    self.drop_link(a, p)?;
                    return Ok(Answer::Done);
                }
                if a.nlink == 0 {
                    return Err(MdError::new(errno::ENOENT, format!("{fid} was unlinked")));
                }
                if a.nlink >= LINK_MAX {
                    return Err(MdError::new(errno::EMLINK, format!("{fid} has {LINK_MAX} links")));
                }
                a.nlink += 1;
                a.ctime_ns = self.now;
                self.put(&a, p)?;
                Ok(Answer::Attr(a))
            }
            Update::Rmdir { fid } => {
                self.local(*fid)?;
                let (a, _) = self.get(*fid)?;
                if !mode::is_dir(a.mode) {
                    return Err(MdError::new(errno::ENOTDIR, format!("{fid} is not a directory")));
                }
                if !self.dir_is_empty(*fid)? {
                    return Err(MdError::new(errno::ENOTEMPTY, format!("directory {fid} is not empty")));
                }
                self.destroy(&a, false)?;
                Ok(Answer::Done)
            }
            Update::Kill { fid } => {
                self.local(*fid)?;
                let (mut a, p) = self.get(*fid)?;
                if !mode::is_dir(a.mode) {
                    return Err(MdError::new(errno::ENOTDIR, format!("{fid} is not a directory")));
                }
                if !self.dir_is_empty(*fid)? {
                    return Err(MdError::new(errno::ENOTEMPTY, format!("directory {fid} is not empty")));
                }
                a.nlink = 0;
                a.ctime_ns = self.now;
                self.put(&a, p)?;
                Ok(Answer::Done)
            }
            Update::Revive { fid } => {
                self.local(*fid)?;
                let (mut a, p) = self.get(*fid)?;
                if !mode::is_dir(a.mode) {
                    return Err(MdError::new(errno::ENOTDIR, format!("{fid} is not a directory")));
                }
                a.nlink = 2;
                a.ctime_ns = self.now;
                self.put(&a, p)?;
                Ok(Answer::Done)
            }
            Update::CopyDefault { fid, default } => {
                self.local(*fid)?;
                let (a, _) = self.get(*fid)?;
                if !mode::is_dir(a.mode) {
                    return Err(MdError::new(errno::ENOTDIR, format!("{fid} is not a directory")));
                }
                let d = if default.is_empty() { None } else { Some(DirDefault::decode(default)?) };
                self.set_dir_default(*fid, d)?;
                Ok(Answer::Done)
            }
            Update::SetParent { fid, parent } => {
                self.local(*fid)?;
                let (mut a, _) = self.get(*fid)?;
                a.ctime_ns = self.now;
                self.put(&a, *parent)?;
                Ok(Answer::Done)
            }
            Update::CopyAttr { fid, mode: m, uid, gid } => {
                self.local(*fid)?;
                let (mut a, p) = self.get(*fid)?;
                a.mode = (a.mode & mode::S_IFMT) | (m & mode::PERMS);
                (a.uid, a.gid, a.ctime_ns) = (*uid, *gid, self.now);
                self.put(&a, p)?;
                Ok(Answer::Attr(a))
            }
        }
    }
}

impl Namespace {
    /// The change that applies update `u` (one step of an operation over several MDTs).
    pub fn update_change(u: Update) -> Change {
        Box::new(move |tx| tx.apply_update(&u))
    }

    /// Begin an operation over several MDTs: `plan` checks what it can here and makes
    /// the steps (it may take FIDs, see [`Tx::fid_on`]); the intent is stored and the
    /// change answers [`Answer::Intent`]. Submit it with the client's reply key.
    pub fn begin_intent_change(
        client: Option<ReplyKey>,
        plan: impl FnOnce(&mut Tx<'_>) -> Result<(Vec<Step>, Option<u32>)> + Send + 'static,
    ) -> Change {
        Box::new(move |tx| {
            let (steps, reply) = plan(tx)?;
            if steps.len() > STEPS_MAX {
                return Err(MdError::new(errno::EINVAL, format!("an operation of {} steps", steps.len())));
            }
            let id = tx.meta("intent_next").unwrap_or(1);
            tx.put_meta("intent_next", id + 1)?;
            let v = Intent { id, client, steps, reply }.encode();
            tx.apply(Op::Intent(id, Some(v.into())));
            Ok(Answer::Intent(id))
        })
    }

    /// End intent `id`: it goes, and the client's reply record takes `answer`. Submit
    /// it without a reply key.
    pub fn end_intent_change(id: u64, client: Option<ReplyKey>, answer: Result<Answer>) -> Change {
        Box::new(move |tx| {
            if tx.m().intents.contains_key(&id) {
                tx.apply(Op::Intent(id, None));
            }
            if let Some(k) = client {
                tx.put_reply(k.client, k.xid, &Stored { digest: k.digest, answer }.encode())?;
            }
            Ok(Answer::Done)
        })
    }

    /// The intents not yet ended, oldest first.
    pub fn intents(&self) -> Result<Vec<Intent>> {
        read(&self.mem).intents.values().map(|v| Intent::decode(v)).collect()
    }

    /// Is intent `id` still open?
    pub fn intent_open(&self, id: u64) -> Result<bool> {
        Ok(read(&self.mem).intents.contains_key(&id))
    }

    /// The stripes of directory `dir`, if it is striped.
    pub fn dir_stripe(&self, dir: Fid) -> Result<Option<DirStripe>> {
        match read(&self.mem).dirstripes.get(&dir.key()) {
            Some(v) => Ok(Some(DirStripe::decode(v)?)),
            None => Ok(None),
        }
    }

    /// The default of `dir`'s new subdirectories.
    pub fn dir_default(&self, dir: Fid) -> Result<Option<DirDefault>> {
        match read(&self.mem).dirdefaults.get(&dir.key()) {
            Some(v) => Ok(Some(DirDefault::decode(v)?)),
            None => Ok(None),
        }
    }

    /// The change that sets (or with `None` removes) the default of `dir`'s new
    /// subdirectories (`setdirstripe -D`); its owner or root may.
    pub fn set_dir_default_change(cred: &Cred, dir: Fid, d: Option<DirDefault>) -> Change {
        let cred = cred.clone();
        Box::new(move |tx| {
            tx.local(dir)?;
            let (a, _) = tx.get(dir)?;
            if !mode::is_dir(a.mode) {
                return Err(MdError::new(errno::ENOTDIR, format!("{dir} is not a directory")));
            }
            if cred.uid != 0 && cred.uid != a.uid {
                return Err(MdError::new(errno::EPERM, format!("uid {} does not own {dir}", cred.uid)));
            }
            if tx.dir_stripe(dir)?.is_some() {
                // Its shards take it too (see `dne`): new subdirectories are made there.
                return Err(coordinate(format!("{dir} is a striped directory")));
            }
            tx.set_dir_default(dir, d)?;
            Ok(Answer::Done)
        })
    }

    /// As [`Namespace::set_dir_default_change`], for a striped directory's master alone
    /// (the coordinator gives its shards the same after it).
    pub fn set_dir_default_change_plain(cred: &Cred, dir: Fid, d: Option<DirDefault>) -> Change {
        let cred = cred.clone();
        Box::new(move |tx| {
            tx.local(dir)?;
            let (a, _) = tx.get(dir)?;
            if cred.uid != 0 && cred.uid != a.uid {
                return Err(MdError::new(errno::EPERM, format!("uid {} does not own {dir}", cred.uid)));
            }
            tx.set_dir_default(dir, d)?;
            Ok(Answer::Done)
        })
    }

    /// Is `dir` a directory with entries (or shards)?
    pub fn dir_has_entries(&self, dir: Fid) -> Result<bool> {
        Ok(read(&self.mem).has_entries(dir.key()))
    }

    /// Read access check for the coordinator's planning: may `cred` do `want` (4 read,
    /// 2 write, 1 search) on `a`?
    pub fn may(cred: &Cred, a: &nacre_proto::mdt::Attr, want: u32) -> bool {
        may(cred, a, want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intents_round_trip() {
        let i = Intent {
            id: 9,
            client: Some(ReplyKey { client: 1, xid: 2, acked_below: 3, digest: 4 }),
            steps: vec![
                Step {
                    mdt: 1,
                    update: Update::Rmdir { fid: Fid::ROOT },
                    undo: Some(Update::SetParent { fid: Fid::ROOT, parent: Fid::ROOT }),
                },
                Step { mdt: 0, update: Update::Link { fid: Fid::ROOT, delta: 1 }, undo: None },
            ],
            reply: Some(1),
        };
        assert_eq!(Intent::decode(&i.encode()).unwrap(), i);
        let j = Intent { client: None, reply: None, ..i };
        assert_eq!(Intent::decode(&j.encode()).unwrap(), j);
    }
}
