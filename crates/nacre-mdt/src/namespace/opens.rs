//! Open handles, in memory: they do not survive a restart (a create-open replayed after
//! one gets its handle back; other opens must be opened again, and files unlinked while
//! open are removed). Each start numbers its handles from a base of its own, so a handle
//! from before a restart is not given to another open after it.

use super::*;

/// The open handles: by number, and counted per inode, per writer and per client.
pub(super) struct Opens {
    pub(super) next: u64,
    /// Handle → (inode, owning client, open for writing).
    pub(super) handles: HashMap<u64, (u128, u64, bool)>,
    pub(super) counts: HashMap<u128, u32>,
    /// Handles open for writing, per inode.
    pub(super) writers: HashMap<u128, u32>,
    pub(super) per_owner: HashMap<u64, usize>,
}

impl Opens {
    pub(super) fn new() -> Opens {
        Opens {
            // 2^40 handles a start, from a base of 24 random bits.
            next: (wal::fresh_generation() & 0xff_ffff) << 40,
            handles: HashMap::new(),
            counts: HashMap::new(),
            writers: HashMap::new(),
            per_owner: HashMap::new(),
        }
    }
}

/// Drop handle `handle` of client `owner`; the file's key if that was its last handle.
fn release(o: &mut Opens, owner: u64, handle: u64) -> Result<Option<u128>> {
    let Some(&(k, by, write)) = o.handles.get(&handle).filter(|(_, by, _)| *by == owner) else {
        return Err(MdError::new(errno::EBADF, format!("client {owner:#x} has no open handle {handle}")));
    };
    o.handles.remove(&handle);
    if write && let Some(w) = o.writers.get_mut(&k) {
        *w -= 1;
        if *w == 0 {
            o.writers.remove(&k);
        }
    }
    if let Some(n) = o.per_owner.get_mut(&by) {
        *n -= 1;
        if *n == 0 {
            o.per_owner.remove(&by);
        }
    }
    let n = o.counts.entry(k).or_default();
    *n -= 1;
    if *n > 0 {
        return Ok(None);
    }
    o.counts.remove(&k);
    Ok(Some(k))
}

impl Namespace {
    /// The file `owner`'s `handle` has open, and whether for writing.
    pub fn handle_of(&self, owner: u64, handle: u64) -> Option<(Fid, bool)> {
        let o = lock(&self.opens);
        o.handles.get(&handle).filter(|(_, by, _)| *by == owner).map(|&(k, _, write)| (Fid::from_key(k), write))
    }

    /// Whether `handle` is `owner`'s, on `fid`, and open for writing.
    pub fn writes_through(&self, handle: u64, fid: Fid, owner: u64) -> bool {
        lock(&self.opens).handles.get(&handle).is_some_and(|&(k, by, write)| k == fid.key() && by == owner && write)
    }

    /// Is `handle` client `owner`'s open of `fid` for writing, and the only handle open
    /// for writing `fid` on any client?
    pub fn sole_writer(&self, handle: u64, fid: Fid, owner: u64) -> bool {
        let o = lock(&self.opens);
        o.writers.get(&fid.key()) == Some(&1)
            && o.handles.get(&handle).is_some_and(|&(k, by, write)| k == fid.key() && by == owner && write)
    }

    /// Is `handle` client `owner`'s open of `fid` (for any use)?
    pub fn opened_by(&self, handle: u64, fid: Fid, owner: u64) -> bool {
        lock(&self.opens).handles.get(&handle).is_some_and(|&(k, by, _)| k == fid.key() && by == owner)
    }

    /// Open `fid` for reading and/or writing on behalf of client `owner`; returns a
    /// handle for `close_file`.
    pub fn open_file(&self, owner: u64, cred: &Cred, fid: Fid, read: bool, write: bool) -> Result<(u64, Attr)> {
        self.open_as(owner, Some(cred), fid, read, write)
    }

    /// [`Namespace::open_file`], with the whole file's bytes when it is opened for reading,
    /// its layout keeps all of them here and they are at most `dom_read` (DoM
    /// read-on-open: a small file is opened and read in one request); none otherwise.
    pub fn open_reading(
        &self,
        owner: u64,
        cred: &Cred,
        fid: Fid,
        read: bool,
        write: bool,
        dom_read: u32,
    ) -> Result<(u64, Attr, Vec<u8>)> {
        let (handle, attr) = self.open_locked(lock(&self.opens), owner, Some(cred), fid, read, write, None)?;
        let data = self.read_on_open(cred, &attr, read, dom_read);
        Ok((handle, attr, data))
    }

    /// The whole of a file just opened, if it was opened for reading and its bytes are
    /// all here and at most `dom_read` (none otherwise). They are a bonus: if they cannot
    /// be read now, the open stands without them and the reader's own read meets the
    /// error.
    pub(super) fn read_on_open(&self, cred: &Cred, attr: &Attr, read: bool, dom_read: u32) -> Vec<u8> {
        let whole = read
            && mode::is_reg(attr.mode)
            && attr.size > 0
            && attr.size <= u64::from(dom_read).min(DOM_IO_MAX as u64)
            && self.dom_end(attr.fid).ok().flatten().is_some_and(|end| attr.size <= end);
        if whole { self.read_dom(cred, attr.fid, 0, attr.size as usize).unwrap_or_default() } else { Vec::new() }
    }

    /// Open `name` in `dir` as [`Namespace::open_reading`] (the lookup and the open in one
    /// call), unless the entry's inode is on another MDT.
    #[allow(clippy::too_many_arguments)]
    pub fn open_at(
        &self,
        owner: u64,
        cred: &Cred,
        dir: Fid,
        name: &str,
        read: bool,
        write: bool,
        dom_read: u32,
    ) -> Result<OpenAnswer> {
        let a = self.lookup(cred, dir, name)?;
        if a.fid.mdt() != Some(self.index) {
            return Ok(OpenAnswer::Elsewhere(a));
        }
        self.open_reading(owner, cred, a.fid, read, write, dom_read).map(OpenAnswer::Here)
    }

    /// Open a regular file the caller has just made (create-open): as open(2) with
    /// O_CREAT, the creator may open it whatever its mode says.
    pub fn open_created(&self, owner: u64, fid: Fid, read: bool, write: bool) -> Result<(u64, Attr)> {
        self.open_as(owner, None, fid, read, write)
    }

    /// An open (or create-open) replayed after a restart: `fid` opened again as
    /// `handle`, the number its first open gave, even if unlinked meanwhile (an orphan,
    /// kept for this).
    pub fn reopen(&self, owner: u64, fid: Fid, read: bool, write: bool, handle: u64) -> Result<(u64, Attr)> {
        self.open_locked(lock(&self.opens), owner, None, fid, read, write, Some(handle))
    }

    /// Open `fid`, checking `cred`'s permission if given.
    pub(super) fn open_as(
        &self,
        owner: u64,
        cred: Option<&Cred>,
        fid: Fid,
        read: bool,
        write: bool,
    ) -> Result<(u64, Attr)> {
        self.open_locked(lock(&self.opens), owner, cred, fid, read, write, None)
    }

    /// `open_as` with the handle table held; `handle`: the number to give (a replay's).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open_locked(
        &self,
        mut o: MutexGuard<'_, Opens>,
        owner: u64,
        cred: Option<&Cred>,
        fid: Fid,
        read: bool,
        write: bool,
        handle: Option<u64>,
    ) -> Result<(u64, Attr)> {
        if let Some(h) = handle
            && o.handles.contains_key(&h)
        {
            return Err(MdError::new(errno::EEXIST, format!("a replayed open's handle {h:#x} is taken")));
        }
        // Under the lock every change holds while it runs: the inode read here is not
        // being removed meanwhile.
        let a = self.getattr(fid)?;
        // A replayed open (`handle`) may reopen a file unlinked while it was open.
        if a.nlink == 0 && handle.is_none() {
            return Err(MdError::new(errno::ENOENT, format!("{fid} was unlinked")));
        }
        if write && mode::is_dir(a.mode) {
            return Err(MdError::new(errno::EISDIR, format!("{fid} is a directory: not for writing")));
        }
        let want = if read { R } else { 0 } | if write { W } else { 0 };
        if let Some(cred) = cred
            && !may_acl(&super::read(&self.mem), cred, &a, want)
        {
            return Err(denied(cred, "open", &a));
        }
        let held = o.per_owner.entry(owner).or_default();
        if *held >= OPEN_HANDLES_PER_CLIENT_MAX {
            return Err(MdError::new(
                errno::EMFILE,
                format!("client {owner:#x} holds {OPEN_HANDLES_PER_CLIENT_MAX} open handles"),
            ));
        }
        *held += 1;
        let h = match handle {
            Some(h) => h,
            None => loop {
                o.next += 1;
                if !o.handles.contains_key(&o.next) {
                    break o.next;
                }
            },
        };
        o.handles.insert(h, (fid.key(), owner, write));
        *o.counts.entry(fid.key()).or_default() += 1;
        if write {
            *o.writers.entry(fid.key()).or_default() += 1;
        }
        Ok((h, a))
    }

    /// Whether some client has `fid` open for writing.
    pub fn is_open_for_write(&self, fid: Fid) -> bool {
        lock(&self.opens).writers.contains_key(&fid.key())
    }

    /// Those of `fids` some client has open for writing (as
    /// [`Namespace::is_open_for_write`]), under one look at the table.
    pub fn open_for_write(&self, fids: impl IntoIterator<Item = Fid>) -> std::collections::HashSet<Fid> {
        let o = lock(&self.opens);
        fids.into_iter().filter(|f| o.writers.contains_key(&f.key())).collect()
    }

    /// Drop every handle of a client that is gone (evicted): its unlinked files go.
    pub fn release_client(&self, owner: u64) -> Result<()> {
        let handles: Vec<u64> =
            lock(&self.opens).handles.iter().filter(|(_, (_, o, _))| *o == owner).map(|(h, _)| *h).collect();
        for h in handles {
            self.close_file(owner, h)?;
        }
        Ok(())
    }

    /// Make client `client` one this MDT waits for in recovery after a restart, before it
    /// holds state only its replay can bring back (an open, a lock) without having made a
    /// change: an answer record of its own (xid 0, pruned by its first change's), on the
    /// drives before this returns. Nothing to do for a client known already. Blocking.
    pub fn remember_client(&self, client: u64) -> Result<()> {
        if self.knows_client(client) {
            return Ok(());
        }
        let record = Stored { digest: 0, answer: Ok(Answer::Done) }.encode();
        self.change(None, Box::new(move |tx| tx.put_reply(client, 0, &record).map(|()| Answer::Done)))?;
        Ok(())
    }

    /// Let go of client `client` (the transport evicted it, or it left): its open files
    /// are closed and its reply records deleted.
    pub fn forget_client(&self, client: u64) -> Result<()> {
        self.release_client(client)?;
        if !self.knows_client(client) {
            // It never made a change (a `get-param`, a reader): nothing to forget.
            return Ok(());
        }
        self.change(
            None,
            Box::new(move |tx| {
                let xids: Vec<u64> = tx.m().replies.range((client, 0)..=(client, u64::MAX)).map(|(k, _)| k.1).collect();
                for x in xids {
                    tx.del_reply(client, x)?;
                }
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// Close a handle of client `owner`; the last close of a file unlinked meanwhile
    /// removes it.
    pub fn close_file(&self, owner: u64, handle: u64) -> Result<()> {
        let Some(key) = release(&mut lock(&self.opens), owner, handle)? else { return Ok(()) };
        // Only an unlinked file needs a change.
        if self.read_inode(Fid::from_key(key)).is_ok_and(|(a, _)| a.nlink > 0) {
            return Ok(());
        }
        self.change(
            None,
            Box::new(move |tx| {
                let orphan = tx.m().orphans.contains(&key);
                if orphan && tx.opens.get(&key).is_none_or(|&n| n == 0) {
                    let (a, _) = tx.get(Fid::from_key(key))?;
                    tx.destroy(&a, true)?;
                }
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// [`Namespace::close_file`] if it makes no change: `None` (and nothing done) when
    /// this close must remove a file unlinked meanwhile (a change, which may wait for
    /// room in the log).
    pub fn try_close_file(&self, owner: u64, handle: u64) -> Option<Result<()>> {
        let mut o = lock(&self.opens);
        if let Some(&(k, by, _)) = o.handles.get(&handle)
            && by == owner
            && o.counts.get(&k) == Some(&1)
            && !self.read_inode(Fid::from_key(k)).is_ok_and(|(a, _)| a.nlink > 0)
        {
            return None;
        }
        // The last close of a linked file, or not the last close: nothing to change (an
        // unlink decides under this same lock whether the file is open).
        Some(release(&mut o, owner, handle).map(|_| ()))
    }
}
