//! The changes: making, linking, removing and renaming names, attributes, xattrs and
//! directory layouts, each checked in full before it writes.

use super::*;

impl Tx<'_> {
    /// The layout a new file in `dir` gets: `asked` if given, else the directory's
    /// default, else the file system's (the root's default, else one 1 MiB stripe); unset
    /// counts and sizes come from the file system default (Lustre's inheritance).
    pub(super) fn layout_for_new_file(&self, dir: Fid, asked: Option<&Layout>) -> Result<Layout> {
        let root = self.layout_of(Fid::ROOT)?;
        let fs_default = root
            .as_ref()
            .and_then(|l| {
                l.components.iter().find_map(|c| match &c.kind {
                    Kind::Stripes(s) => Some(s.clone()),
                    Kind::Mdt => None,
                })
            })
            .map(|mut s| {
                s.fill_defaults(&Striping::fs_default());
                s
            })
            .unwrap_or_else(Striping::fs_default);
        let dir_default = match asked {
            Some(_) => None,
            None => self.layout_of(dir)?.or(root),
        };
        let mut l = match asked {
            Some(l) => l.clone(),
            None => Layout::inherited(dir_default.as_ref(), &fs_default),
        };
        // An MDT short of room puts no more new files' first bytes on itself: their
        // first striped component starts at 0 instead (as Lustre's dom_threshold_free_mb).
        if l.components.len() > 1 && l.components[0].kind == Kind::Mdt && !self.ns.dom_fits(self.m().dom_units) {
            l.components.remove(0);
            l.components[0].start = 0;
        }
        l.fill_defaults(&fs_default);
        l.validate().map_err(|e| MdError::new(errno::EINVAL, format!("layout: {e}")))?;
        self.ns.check_pools(&l)?;
        Ok(l)
    }

    /// A directory the caller may change entries of (W and X).
    pub(super) fn dir_for_change(&self, cred: &Cred, dir: Fid) -> Result<(Attr, Fid)> {
        let (d, p) = self.get(dir)?;
        if !mode::is_dir(d.mode) {
            return Err(MdError::new(errno::ENOTDIR, format!("{dir} is not a directory")));
        }
        if d.nlink == 0 {
            return Err(MdError::new(errno::ENOENT, format!("directory {dir} was removed")));
        }
        if !self.permits(cred, &d, W | X) {
            return Err(denied(cred, "change entries of", &d));
        }
        self.not_striped(dir)?;
        Ok((d, p))
    }

    pub(super) fn lookup(&self, dir: Fid, name: &str) -> Result<Option<(Fid, u32)>> {
        Ok(self.m().entry(dir.key(), cookie_of(name), name).map(|(f, k)| (Fid::from_key(f), k)))
    }

    pub(super) fn new_fid(&mut self) -> Result<Fid> {
        if let Some(fid) = self.replay_fid.take() {
            if self.m().inode(fid.key()).is_some() {
                return Err(MdError::new(errno::EEXIST, format!("a replayed create's {fid} is another inode's")));
            }
            // The allocator moves past it, so no later create is given it again.
            let seq = Fid::seq_of(self.ns.index, self.alloc.seq_k);
            if fid.seq == seq && fid.oid >= self.alloc.next_oid {
                self.alloc.next_oid = fid.oid.saturating_add(1);
            }
            return Ok(fid);
        }
        let fid = Fid::new(Fid::seq_of(self.ns.index, self.alloc.seq_k), self.alloc.next_oid);
        if self.alloc.next_oid == u32::MAX {
            self.alloc.seq_k += 1;
            self.alloc.next_oid = 1;
        } else {
            self.alloc.next_oid += 1;
        }
        Ok(fid)
    }

    /// Sticky directories: only the owner of the entry or of the directory (or root) may
    /// remove or rename it.
    pub(super) fn sticky_ok(cred: &Cred, dir: &Attr, victim: &Attr) -> bool {
        dir.mode & mode::S_ISVTX == 0 || cred.uid == 0 || cred.uid == dir.uid || cred.uid == victim.uid
    }

    /// Entry `name` (inode `child`) of a directory with attributes `d`, checked before
    /// `cred` removes it or a rename replaces it, in Linux's order (`may_delete`, then the
    /// file system): its inode is here, it is no striped directory (that needs the
    /// coordinator), the sticky bit lets `cred` (EPERM), it is a directory exactly when
    /// `dir` (ENOTDIR, EISDIR), and a directory is empty (ENOTEMPTY). Its attributes, the
    /// parent they record, and whether it is a directory.
    pub(super) fn removable(
        &self,
        cred: &Cred,
        d: &Attr,
        child: Fid,
        name: &str,
        dir: bool,
    ) -> Result<(Attr, Fid, bool)> {
        self.local(child)?;
        let (a, ap) = self.get(child)?;
        let is_dir = mode::is_dir(a.mode);
        if is_dir && self.dir_stripe(child)?.is_some() {
            return Err(coordinate(format!("{name:?} is a striped directory")));
        }
        if !Tx::sticky_ok(cred, d, &a) {
            return Err(MdError::new(errno::EPERM, format!("{name:?} is in a sticky directory and not yours")));
        }
        if dir && !is_dir {
            return Err(MdError::new(errno::ENOTDIR, format!("{name:?} is not a directory")));
        }
        if !dir && is_dir {
            return Err(MdError::new(errno::EISDIR, format!("{name:?} is a directory")));
        }
        if is_dir && !self.dir_is_empty(child)? {
            return Err(MdError::new(errno::ENOTEMPTY, format!("directory {name:?} is not empty")));
        }
        Ok((a, ap, is_dir))
    }

    pub(super) fn add_entry(&self, dir: Fid, name: &str, child: Fid, kind: u32) -> Result<()> {
        let (dir, hash, to) = (dir.key(), cookie_of(name), Some((child.key(), kind)));
        self.apply(Op::Dirent { dir, hash, name: name.into(), to });
        Ok(())
    }

    pub(super) fn remove_entry(&self, dir: Fid, name: &str) -> Result<()> {
        self.apply(Op::Dirent { dir: dir.key(), hash: cookie_of(name), name: name.into(), to: None });
        Ok(())
    }

    pub(super) fn dir_is_empty(&self, dir: Fid) -> Result<bool> {
        Ok(!self.m().has_entries(dir.key()))
    }

    /// Touch a directory after its entries changed: mtime and ctime now, `nlink` by
    /// `dlink`.
    pub(super) fn touch_dir(&self, mut d: Attr, parent: Fid, dlink: i64) -> Result<Attr> {
        d.mtime_ns = self.now;
        d.ctime_ns = self.now;
        d.nlink = (d.nlink as i64 + dlink).max(0) as u32;
        self.put(&d, parent)?;
        Ok(d)
    }

    /// Drop one link of `a`; the inode goes with its last link unless it is open.
    pub(super) fn drop_link(&self, mut a: Attr, parent: Fid) -> Result<()> {
        a.nlink = a.nlink.saturating_sub(if mode::is_dir(a.mode) { a.nlink } else { 1 });
        a.ctime_ns = self.now;
        if a.nlink > 0 {
            return self.put(&a, parent);
        }
        if self.opens.get(&a.fid.key()).is_some_and(|&n| n > 0) {
            self.put(&a, parent)?;
            return self.put_orphan(a.fid);
        }
        self.destroy(&a, false)
    }

    /// Remove an inode and everything hanging off it (what its type can have: a symlink
    /// its target, a file its layout, objects and DoM data, a directory its default
    /// layout; an orphan its orphan record).
    pub(super) fn destroy(&self, a: &Attr, orphan: bool) -> Result<()> {
        let (fid, k) = (a.fid, a.fid.key());
        self.depend_on(fid);
        self.apply(Op::Inode(k, None));
        if mode::is_lnk(a.mode) && self.m().symlinks.contains_key(&k) {
            self.apply(Op::Symlink(k, None));
        }
        if orphan && self.m().orphans.contains(&k) {
            self.apply(Op::Orphan(k, false));
        }
        if mode::is_reg(a.mode) || mode::is_dir(a.mode) {
            self.del_layout(fid)?;
        }
        if mode::is_dir(a.mode) {
            self.del_dir_stripe(fid)?;
            self.set_dir_default(fid, None)?;
        }
        if mode::is_reg(a.mode) {
            // The file's OST objects go to the destroy log, destroyed in the background.
            let objects = self.m().objects.get(&k).map(|v| decode_objects(v)).transpose()?;
            if let Some(objects) = objects {
                self.apply(Op::Objects(k, None));
                for (ost, oid) in objects.into_iter().flatten() {
                    self.put_destroy(ost, oid);
                }
            }
            self.trim_dom(fid, 0)?;
            if self.m().ost_blocks.contains_key(&k) {
                self.apply(Op::OstBlocks(k, None));
            }
        }
        let names: Vec<String> = self.m().xattrs_of(k).map(|(n, _)| n.to_string()).collect();
        for n in names {
            self.del_xattr(fid, &n)?;
        }
        Ok(())
    }

    /// Make a new inode named `name` in `dir`.
    pub(super) fn make(
        &mut self,
        cred: &Cred,
        dir: Fid,
        name: &str,
        mode_bits: u32,
        kind: u32,
        layout: Option<&Layout>,
    ) -> Result<(Attr, Attr, Fid)> {
        check_name(name)?;
        // As Linux: an existing name is EEXIST before any write permission is asked (the
        // lookup needs search permission only).
        let (d, dp) = self.get(dir)?;
        if mode::is_dir(d.mode)
            && self.permits(cred, &d, X)
            && d.nlink > 0
            && let Some((f, _)) = self.lookup(dir, name)?
        {
            return Err(MdError::new(errno::EEXIST, format!("{name:?} exists in {dir} (as {f})")));
        }
        self.dir_for_change(cred, dir)?;
        self.ns.room_to_grow(&self.m())?;
        // A replayed create keeps the layout and objects its first run gave.
        let replayed = self.replay_objects.take().filter(|_| kind == mode::S_IFREG);
        let layout = match &replayed {
            Some((l, objects)) if !l.is_empty() => {
                // The client's word: checked as a layout asked for would be.
                let bad = |e: String| MdError::new(errno::EINVAL, format!("a replayed create's layout: {e}"));
                let l = Layout::decode(l).map_err(|e| bad(e.to_string()))?;
                l.validate().map_err(|e| bad(e.to_string()))?;
                if l.components.len() != objects.len() {
                    let (c, o) = (l.components.len(), objects.len());
                    return Err(bad(format!("{c} components, objects for {o}")));
                }
                Some(l)
            }
            _ if kind == mode::S_IFREG => Some(self.layout_for_new_file(dir, layout)?),
            _ => None,
        };
        // The last check (a pool may be short, a claimed object taken): after it only
        // writes.
        let objects = match (&layout, replayed) {
            (Some(_), Some((_, objects))) => Some(self.claim(&objects)?),
            (Some(l), None) => self.instantiate(l, &Vec::new(), 1)?,
            (None, _) => None,
        };
        // A setgid directory passes its group (and, to subdirectories, the bit) down.
        let gid = if d.mode & mode::S_ISGID != 0 { d.gid } else { cred.gid };
        let mut perms = mode_bits & mode::PERMS;
        // A directory's default ACL decides the new inode's permissions (and becomes its
        // access ACL, and a subdirectory's default); without one, the umask does.
        let default = self.m().xattr(dir.key(), acl::DEFAULT).map(<[u8]>::to_vec);
        let inherited = match default.as_deref().map(Acl::from_xattr) {
            Some(Ok(def)) if kind != mode::S_IFLNK => {
                let (access, bits) = def.inherit(perms & 0o777);
                perms = (perms & !0o777) | bits;
                Some(access)
            }
            _ if kind == mode::S_IFLNK => None,
            _ => {
                perms &= !(cred.umask & 0o777);
                None
            }
        };
        if kind == mode::S_IFDIR {
            // mkdir never takes setuid or setgid from the caller.
            perms &= !(mode::S_ISUID | mode::S_ISGID);
            if d.mode & mode::S_ISGID != 0 {
                perms |= mode::S_ISGID;
            }
        } else if perms & (mode::S_ISGID | 0o010) == (mode::S_ISGID | 0o010) && cred.uid != 0 && !cred.in_group(gid) {
            // Linux's mode_strip_sgid: no setgid-executable file of a group one is not in.
            perms &= !mode::S_ISGID;
        }
        let fid = self.new_fid()?;
        let a = Attr {
            fid,
            mode: kind | perms,
            nlink: if kind == mode::S_IFDIR { 2 } else { 1 },
            uid: cred.uid,
            gid,
            size: 0,
            blocks: 0,
            atime_ns: self.now,
            mtime_ns: self.now,
            ctime_ns: self.now,
            rdev: 0,
        };
        self.put(&a, if kind == mode::S_IFDIR { dir } else { Fid::default() })?;
        if let Some(access) = inherited.filter(|acl| !acl.is_mode()) {
            self.put_xattr(fid, acl::ACCESS, &access.to_xattr())?;
        }
        if let (mode::S_IFDIR, Some(def)) = (kind, &default) {
            self.put_xattr(fid, acl::DEFAULT, def)?;
        }
        if kind == mode::S_IFDIR
            && let Some(def) = self.dir_default_of(dir)?.and_then(|d| d.inherited())
        {
            self.set_dir_default(fid, Some(def))?;
        }
        if let Some(l) = &layout {
            self.put_layout(fid, l)?;
        }
        // A new subdirectory takes its parent's default file layout, as on Lustre (the
        // root's is the file system's default, which applies everywhere anyway).
        if kind == mode::S_IFDIR
            && dir != Fid::ROOT
            && let Some(l) = self.layout_of(dir)?
        {
            self.put_layout(fid, &l)?;
        }
        if let Some(o) = &objects {
            self.put_objects(fid, o)?;
        }
        self.add_entry(dir, name, fid, kind)?;
        let d = self.touch_dir(d, dp, if kind == mode::S_IFDIR { 1 } else { 0 })?;
        Ok((a, d, dp))
    }
}

impl Namespace {
    /// Make a regular file `name` in `dir` with permission bits `perms`.
    pub fn create(&self, cred: &Cred, dir: Fid, name: &str, perms: u32, key: Option<ReplyKey>) -> Result<Attr> {
        Self::attr_of(self.change(key, Self::create_change(cred, dir, name, perms))?)
    }

    /// The change `create` makes, for [`Namespace::submit`].
    pub fn create_change(cred: &Cred, dir: Fid, name: &str, perms: u32) -> Change {
        let (cred, name) = (cred.clone(), name.to_string());
        Box::new(move |tx| Ok(Answer::Attr(tx.make(&cred, dir, &name, perms, mode::S_IFREG, None)?.0)))
    }

    /// Make a regular file with the layout `layout` (`lfs setstripe` on a new file); it
    /// must validate. Without one the file inherits (see [`Namespace::layout`]).
    pub fn create_with_layout(
        &self,
        cred: &Cred,
        dir: Fid,
        name: &str,
        perms: u32,
        layout: Layout,
        key: Option<ReplyKey>,
    ) -> Result<Attr> {
        Self::attr_of(self.change(key, Self::create_with_layout_change(cred, dir, name, perms, layout))?)
    }

    /// The change `create_with_layout` makes, for [`Namespace::submit`].
    pub fn create_with_layout_change(cred: &Cred, dir: Fid, name: &str, perms: u32, layout: Layout) -> Change {
        let (cred, name) = (cred.clone(), name.to_string());
        Box::new(move |tx| Ok(Answer::Attr(tx.make(&cred, dir, &name, perms, mode::S_IFREG, Some(&layout))?.0)))
    }

    /// Set (or, with `None`, remove) the default layout of directory `dir`, which its new
    /// files inherit; on the root it is the file system's default. The owner or root may.
    pub fn set_dir_layout(&self, cred: &Cred, dir: Fid, layout: Option<Layout>, key: Option<ReplyKey>) -> Result<()> {
        self.change(key, self.set_dir_layout_change(cred, dir, layout)?)?;
        Ok(())
    }

    /// The change `set_dir_layout` makes (after checking the layout), for
    /// [`Namespace::submit`].
    pub fn set_dir_layout_change(&self, cred: &Cred, dir: Fid, layout: Option<Layout>) -> Result<Change> {
        if let Some(l) = &layout {
            l.validate().map_err(|e| MdError::new(errno::EINVAL, format!("layout: {e}")))?;
            self.check_pools(l)?;
        }
        let cred = cred.clone();
        Ok(Box::new(move |tx| {
            let (mut d, p) = tx.get(dir)?;
            if !mode::is_dir(d.mode) {
                return Err(MdError::new(
                    errno::ENOTDIR,
                    format!("{dir} is not a directory: a file's layout is set when it is made"),
                ));
            }
            if cred.uid != 0 && cred.uid != d.uid {
                return Err(MdError::new(errno::EPERM, format!("uid {} does not own {dir}", cred.uid)));
            }
            match &layout {
                Some(l) => tx.put_layout(dir, l)?,
                None => tx.del_layout(dir)?,
            }
            d.ctime_ns = tx.now;
            tx.put(&d, p)?;
            Ok(Answer::Done)
        }))
    }

    pub fn mkdir(&self, cred: &Cred, dir: Fid, name: &str, perms: u32, key: Option<ReplyKey>) -> Result<Attr> {
        Self::attr_of(self.change(key, Self::mkdir_change(cred, dir, name, perms))?)
    }

    /// The change `mkdir` makes, for [`Namespace::submit`].
    pub fn mkdir_change(cred: &Cred, dir: Fid, name: &str, perms: u32) -> Change {
        let (cred, name) = (cred.clone(), name.to_string());
        Box::new(move |tx| Ok(Answer::Attr(tx.make(&cred, dir, &name, perms, mode::S_IFDIR, None)?.0)))
    }

    pub fn symlink(&self, cred: &Cred, dir: Fid, name: &str, target: &[u8], key: Option<ReplyKey>) -> Result<Attr> {
        Self::attr_of(self.change(key, Self::symlink_change(cred, dir, name, target)?)?)
    }

    /// The change `symlink` makes (after checking the target), for [`Namespace::submit`].
    pub fn symlink_change(cred: &Cred, dir: Fid, name: &str, target: &[u8]) -> Result<Change> {
        if target.is_empty() || target.len() > SYMLINK_MAX {
            return Err(MdError::new(
                if target.is_empty() { errno::ENOENT } else { errno::ENAMETOOLONG },
                format!("symlink target of {} bytes (1 to {SYMLINK_MAX})", target.len()),
            ));
        }
        let (cred, name, target) = (cred.clone(), name.to_string(), target.to_vec());
        Ok(Box::new(move |tx| {
            let (mut a, _, _) = tx.make(&cred, dir, &name, 0o777, mode::S_IFLNK, None)?;
            a.size = target.len() as u64;
            tx.put(&a, Fid::default())?;
            tx.put_symlink(a.fid, &target)?;
            Ok(Answer::Attr(a))
        }))
    }

    /// A FIFO, socket or device node `name` in `dir` (`mknod`), by the type bits of
    /// `mode_bits`; a device node's number is `rdev`. Only root makes device nodes.
    pub fn mknod(
        &self,
        cred: &Cred,
        dir: Fid,
        name: &str,
        mode_bits: u32,
        rdev: u32,
        key: Option<ReplyKey>,
    ) -> Result<Attr> {
        Self::attr_of(self.change(key, Self::mknod_change(cred, dir, name, mode_bits, rdev)?)?)
    }

    /// The change `mknod` makes (after checking the type and device number), for
    /// [`Namespace::submit`].
    pub fn mknod_change(cred: &Cred, dir: Fid, name: &str, mode_bits: u32, rdev: u32) -> Result<Change> {
        let kind = mode_bits & mode::S_IFMT;
        if !mode::is_special(kind) {
            return Err(MdError::new(
                errno::EINVAL,
                format!("mknod makes FIFOs, sockets and device nodes, not file type {kind:o}"),
            ));
        }
        if mode::is_device(kind) && cred.uid != 0 {
            return Err(MdError::new(errno::EPERM, format!("uid {} may not make device nodes", cred.uid)));
        }
        if rdev != 0 && !mode::is_device(kind) {
            return Err(MdError::new(errno::EINVAL, format!("a device number ({rdev:#x}) for a {kind:o}")));
        }
        let (cred, name) = (cred.clone(), name.to_string());
        Ok(Box::new(move |tx| {
            let (mut a, _, _) = tx.make(&cred, dir, &name, mode_bits, kind, None)?;
            if rdev != 0 {
                a.rdev = rdev;
                tx.put(&a, Fid::default())?;
            }
            Ok(Answer::Attr(a))
        }))
    }

    /// A new name `name` in `dir` for the existing file `fid`.
    pub fn link(&self, cred: &Cred, fid: Fid, dir: Fid, name: &str, key: Option<ReplyKey>) -> Result<Attr> {
        Self::attr_of(self.change(key, Self::link_change(cred, fid, dir, name))?)
    }

    /// The change `link` makes, for [`Namespace::submit`].
    pub fn link_change(cred: &Cred, fid: Fid, dir: Fid, name: &str) -> Change {
        let (cred, name) = (cred.clone(), name.to_string());
        Box::new(move |tx| {
            check_name(&name)?;
            let (d, dp) = tx.dir_for_change(&cred, dir)?;
            tx.local(fid)?;
            let (mut a, p) = tx.get(fid)?;
            if mode::is_dir(a.mode) {
                return Err(MdError::new(errno::EPERM, format!("{fid} is a directory: no hard links")));
            }
            if a.nlink == 0 {
                return Err(MdError::new(errno::ENOENT, format!("{fid} was unlinked")));
            }
            if a.nlink >= LINK_MAX {
                return Err(MdError::new(errno::EMLINK, format!("{fid} has {LINK_MAX} links")));
            }
            if tx.lookup(dir, &name)?.is_some() {
                return Err(MdError::new(errno::EEXIST, format!("{name:?} exists in {dir}")));
            }
            a.nlink += 1;
            a.ctime_ns = tx.now;
            tx.put(&a, p)?;
            tx.add_entry(dir, &name, fid, a.mode & mode::S_IFMT)?;
            tx.touch_dir(d, dp, 0)?;
            Ok(Answer::Attr(a))
        })
    }

    /// Remove the entry `name` of `dir`: a non-directory (`rmdir` false) or an empty
    /// directory (`rmdir` true).
    pub fn remove(&self, cred: &Cred, dir: Fid, name: &str, rmdir: bool, key: Option<ReplyKey>) -> Result<()> {
        Self::done(self.change(key, Self::remove_change(cred, dir, name, rmdir))?)
    }

    /// The change `remove` makes, for [`Namespace::submit`].
    pub fn remove_change(cred: &Cred, dir: Fid, name: &str, rmdir: bool) -> Change {
        let (cred, name) = (cred.clone(), name.to_string());
        Box::new(move |tx| {
            if name == "." || name == ".." {
                return Err(MdError::new(errno::EINVAL, format!("cannot remove {name:?}")));
            }
            let (d, dp) = tx.dir_for_change(&cred, dir)?;
            let (child, _) =
                tx.lookup(dir, &name)?.ok_or_else(|| MdError::new(errno::ENOENT, format!("no {name:?} in {dir}")))?;
            let (a, ap, is_dir) = tx.removable(&cred, &d, child, &name, rmdir)?;
            tx.remove_entry(dir, &name)?;
            tx.touch_dir(d, dp, if is_dir { -1 } else { 0 })?;
            tx.drop_link(a, ap)?;
            Ok(Answer::Done)
        })
    }

    /// Rename `src_dir/src_name` to `dst_dir/dst_name`.
    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &self,
        cred: &Cred,
        src_dir: Fid,
        src_name: &str,
        dst_dir: Fid,
        dst_name: &str,
        how: RenameMode,
        key: Option<ReplyKey>,
    ) -> Result<()> {
        Self::done(self.change(key, Self::rename_change(cred, src_dir, src_name, dst_dir, dst_name, how))?)
    }

    /// The change `rename` makes, for [`Namespace::submit`].
    pub fn rename_change(
        cred: &Cred,
        src_dir: Fid,
        src_name: &str,
        dst_dir: Fid,
        dst_name: &str,
        how: RenameMode,
    ) -> Change {
        let (cred, src_name, dst_name) = (cred.clone(), src_name.to_string(), dst_name.to_string());
        Box::new(move |tx| {
            check_name(&dst_name)?;
            if src_name == "." || src_name == ".." {
                return Err(MdError::new(errno::EINVAL, format!("cannot rename {src_name:?}")));
            }
            let (sd, sdp) = tx.dir_for_change(&cred, src_dir)?;
            tx.local(dst_dir)?;
            let (dd, ddp) = if dst_dir == src_dir { (sd, sdp) } else { tx.dir_for_change(&cred, dst_dir)? };
            let (child, kind) = tx
                .lookup(src_dir, &src_name)?
                .ok_or_else(|| MdError::new(errno::ENOENT, format!("no {src_name:?} in {src_dir}")))?;
            tx.local(child)?;
            let (mut a, ap) = tx.get(child)?;
            if !Tx::sticky_ok(&cred, &sd, &a) {
                return Err(MdError::new(errno::EPERM, format!("{src_name:?} is in a sticky directory and not yours")));
            }
            let is_dir = mode::is_dir(a.mode);
            let victim = tx.lookup(dst_dir, &dst_name)?;
            if let Some((v, _)) = victim {
                if how == RenameMode::NoReplace {
                    return Err(MdError::new(errno::EEXIST, format!("{dst_name:?} exists in {dst_dir}")));
                }
                if v == child {
                    // Two names of one inode: POSIX says do nothing.
                    return Ok(Answer::Done);
                }
            }
            if is_dir && dst_dir != src_dir {
                // No directory may move below itself.
                let mut at = dst_dir;
                loop {
                    if at == child {
                        return Err(MdError::new(
                            errno::EINVAL,
                            format!("cannot move directory {child} into its own subtree"),
                        ));
                    }
                    if at == Fid::ROOT {
                        break;
                    }
                    tx.local(at)?;
                    let (_, p) = tx.get(at)?;
                    if p == at || p == Fid::default() {
                        break;
                    }
                    at = p;
                }
                // Its `..` changes: that needs write permission on it.
                if !tx.permits(&cred, &a, W) {
                    return Err(denied(&cred, "move", &a));
                }
            }
            let victim = match victim {
                Some((v, _)) => Some(tx.removable(&cred, &dd, v, &dst_name, is_dir)?),
                None => None,
            };
            if is_dir && victim.is_none() && dst_dir != src_dir && dd.nlink >= LINK_MAX {
                return Err(MdError::new(errno::EMLINK, format!("{dst_dir} has {LINK_MAX} links")));
            }
            // Every check passed: now change.
            tx.remove_entry(src_dir, &src_name)?;
            if victim.is_some() {
                tx.remove_entry(dst_dir, &dst_name)?;
            }
            tx.add_entry(dst_dir, &dst_name, child, kind)?;
            a.ctime_ns = tx.now;
            tx.put(&a, if is_dir { dst_dir } else { ap })?;
            let replaced_dir = victim.as_ref().is_some_and(|v| v.2);
            if src_dir == dst_dir {
                tx.touch_dir(sd, sdp, if replaced_dir { -1 } else { 0 })?;
            } else {
                tx.touch_dir(sd, sdp, if is_dir { -1 } else { 0 })?;
                let (dd, ddp) = tx.get(dst_dir)?;
                tx.touch_dir(
                    dd,
                    ddp,
                    if is_dir && !replaced_dir {
                        1
                    } else if replaced_dir && !is_dir {
                        -1
                    } else {
                        0
                    },
                )?;
            }
            if let Some((va, vp, _)) = victim {
                tx.drop_link(va, vp)?;
            }
            let _ = ddp;
            Ok(Answer::Done)
        })
    }

    /// Change attributes, with POSIX's rules on who may change what.
    pub fn setattr(&self, cred: &Cred, fid: Fid, s: SetAttr, key: Option<ReplyKey>) -> Result<Attr> {
        Self::attr_of(self.change(key, Self::setattr_change(cred, fid, s))?)
    }

    /// The change `setattr` makes, for [`Namespace::submit`].
    pub fn setattr_change(cred: &Cred, fid: Fid, s: SetAttr) -> Change {
        let cred = cred.clone();
        Box::new(move |tx| {
            tx.local(fid)?;
            if (s.mode.is_some() || s.uid.is_some() || s.gid.is_some()) && tx.dir_stripe(fid)?.is_some() {
                // Its shards take the same (see `dne`).
                return Err(coordinate(format!("{fid} is a striped directory")));
            }
            Self::setattr_change_plain(&cred, fid, s)(tx)
        })
    }

    /// As [`Namespace::setattr_change`], for the inode alone (a striped directory's
    /// master, whose shards the coordinator changes after it).
    pub fn setattr_change_plain(cred: &Cred, fid: Fid, s: SetAttr) -> Change {
        let cred = cred.clone();
        Box::new(move |tx| {
            let (mut a, p) = tx.get(fid)?;
            let owner = cred.uid == 0 || cred.uid == a.uid;
            let writer = s.by_writer || tx.permits(&cred, &a, W);
            if let Some(m) = s.mode {
                // What the kernel sends for a writer that is not the owner (Linux's
                // file_remove_privs on write and truncate): the mode less setuid and
                // setgid, nothing else changed.
                let privs = mode::S_ISUID | mode::S_ISGID;
                let drops_privs = m != a.mode & mode::PERMS
                    && m & !privs == a.mode & mode::PERMS & !privs
                    && m & privs & !a.mode == 0;
                let kills_privs = drops_privs && writer && mode::is_reg(a.mode);
                if !(owner || kills_privs) {
                    return Err(MdError::new(errno::EPERM, format!("uid {} does not own {fid}: no chmod", cred.uid)));
                }
                if m & !mode::PERMS != 0 {
                    return Err(MdError::new(errno::EINVAL, format!("mode {m:o} has bits beyond {:o}", mode::PERMS)));
                }
            }
            // Linux's chown_ok and chgrp_ok: the owner may "change" the owner to itself
            // and the group to one of its groups; anything else is root's.
            if let Some(u) = s.uid
                && cred.uid != 0
                && !(cred.uid == a.uid && u == a.uid)
            {
                return Err(MdError::new(errno::EPERM, format!("uid {} may not give {fid} to uid {u}", cred.uid)));
            }
            if let Some(g) = s.gid
                && cred.uid != 0
                && !(cred.uid == a.uid && (g == a.gid || cred.in_group(g)))
            {
                return Err(MdError::new(errno::EPERM, format!("uid {} may not give {fid} to group {g}", cred.uid)));
            }
            if s.ost_blocks.is_some() && (!mode::is_reg(a.mode) || !writer) {
                return Err(denied(&cred, "publish the blocks of", &a));
            }
            if let Some(size) = s.size.or(s.size_at_least) {
                if mode::is_dir(a.mode) {
                    return Err(MdError::new(errno::EISDIR, format!("{fid} is a directory: no truncate")));
                }
                if !mode::is_reg(a.mode) {
                    return Err(MdError::new(errno::EINVAL, format!("{fid} is not a regular file: no truncate")));
                }
                if !writer {
                    return Err(denied(&cred, "truncate", &a));
                }
                if size > i64::MAX as u64 {
                    return Err(MdError::new(errno::EFBIG, format!("size {size} is too large")));
                }
            }
            for t in [s.atime_ns, s.mtime_ns].into_iter().flatten() {
                // Explicit times need ownership (EPERM); "now" also suits a writer
                // (EACCES otherwise).
                match t {
                    Some(_) if !owner => {
                        return Err(MdError::new(errno::EPERM, format!("uid {} may not set times of {fid}", cred.uid)));
                    }
                    None if !owner && !writer => return Err(denied(&cred, "touch", &a)),
                    _ => {}
                }
            }
            let group_exec = |m: u32| m & 0o010 != 0;
            if (s.uid.is_some() || s.gid.is_some()) && !mode::is_dir(a.mode) {
                // A chown clears setuid, and setgid where it means set-group-id (with
                // group execute).
                a.mode &= !mode::S_ISUID;
                if group_exec(a.mode) {
                    a.mode &= !mode::S_ISGID;
                }
            }
            if let Some(u) = s.uid {
                a.uid = u;
            }
            if let Some(g) = s.gid {
                a.gid = g;
            }
            if let Some(m) = s.mode {
                let mut m = m;
                // Without the (new) group, a non-root owner's chmod drops setgid.
                if cred.uid != 0 && !cred.in_group(a.gid) {
                    m &= !mode::S_ISGID;
                }
                a.mode = (a.mode & mode::S_IFMT) | m;
                // An access ACL follows a chmod (its owner, mask and other entries).
                let acl = tx.m().access_acl(fid.key());
                if let Some(mut acl) = acl {
                    acl.chmod(m);
                    tx.put_xattr(fid, acl::ACCESS, &acl.to_xattr())?;
                }
            }
            if let Some(b) = s.ost_blocks {
                // What the objects held last time is replaced by what they hold now.
                let k = fid.key();
                let old = tx.m().ost_blocks.get(&k).copied().unwrap_or(0);
                tx.apply(Op::OstBlocks(k, Some(b)));
                a.blocks = a.blocks.saturating_sub(old) + b;
            }
            if let Some(size) = s.size {
                if size < a.size {
                    let removed = tx.trim_dom(fid, size)?;
                    a.blocks = a.blocks.saturating_sub(removed / 512);
                }
                a.size = size;
                a.mtime_ns = tx.now;
                if cred.uid != 0 {
                    // As a write does: no setuid after a change by someone else.
                    a.mode &= !mode::S_ISUID;
                    if group_exec(a.mode) {
                        a.mode &= !mode::S_ISGID;
                    }
                }
            }
            if let Some(size) = s.size_at_least
                && size > a.size
            {
                a.size = size;
                if cred.uid != 0 {
                    a.mode &= !mode::S_ISUID;
                    if group_exec(a.mode) {
                        a.mode &= !mode::S_ISGID;
                    }
                }
            }
            if let Some(t) = s.atime_ns {
                a.atime_ns = t.unwrap_or(tx.now);
            }
            if let Some(t) = s.mtime_ns {
                a.mtime_ns = t.unwrap_or(tx.now);
            }
            a.ctime_ns = tx.now;
            tx.put(&a, p)?;
            Ok(Answer::Attr(a))
        })
    }

    /// Set xattr `name`; `create` fails if it exists (EEXIST), `replace` if it does not
    /// (ENODATA).
    #[allow(clippy::too_many_arguments)]
    pub fn setxattr(
        &self,
        cred: &Cred,
        fid: Fid,
        name: &str,
        value: &[u8],
        create: bool,
        replace: bool,
        key: Option<ReplyKey>,
    ) -> Result<()> {
        let (change, weight) = self.setxattr_change(cred, fid, name, value, create, replace)?;
        self.change_weighted(key, change, weight)?;
        Ok(())
    }

    /// The change `setxattr` makes (after checking access) and the bytes it logs, for
    /// [`Namespace::submit`].
    pub fn setxattr_change(
        &self,
        cred: &Cred,
        fid: Fid,
        name: &str,
        value: &[u8],
        create: bool,
        replace: bool,
    ) -> Result<(Change, usize)> {
        if value.len() > XATTR_SIZE_MAX {
            return Err(MdError::new(
                errno::E2BIG,
                format!("xattr value of {} bytes (at most {XATTR_SIZE_MAX})", value.len()),
            ));
        }
        let a = self.getattr(fid)?;
        self.xattr_access(cred, &a, name, W)?;
        let acl = match name {
            acl::ACCESS | acl::DEFAULT => {
                Some(Acl::from_xattr(value).map_err(|e| MdError::new(errno::EINVAL, format!("{name} of {fid}: {e}")))?)
            }
            _ => None,
        };
        let (name, value, weight) = (name.to_string(), value.to_vec(), value.len());
        let change: Change = Box::new(move |tx| {
            let (mut a, p) = tx.get(fid)?;
            if let (Some(acl), acl::ACCESS) = (&acl, name.as_str()) {
                // The mode follows the access ACL (its owner, mask or group, and other
                // entries), and an ACL the mode says all of is not kept, as on Linux.
                a.mode = (a.mode & !0o777) | acl.mode_bits();
                a.ctime_ns = tx.now;
                if acl.is_mode() {
                    tx.del_xattr(fid, &name)?;
                    tx.put(&a, p)?;
                    return Ok(Answer::Done);
                }
            }
            let mut used = 0usize;
            let mut old = None;
            for (n, v) in tx.m().xattrs_of(fid.key()) {
                if n == name {
                    old = Some(n.len() + v.len());
                } else {
                    used += n.len() + v.len();
                }
            }
            if create && old.is_some() {
                return Err(MdError::new(errno::EEXIST, format!("{fid} has xattr {name} already")));
            }
            if replace && old.is_none() {
                return Err(MdError::new(errno::ENODATA, format!("{fid} has no xattr {name}")));
            }
            if used + name.len() + value.len() > XATTRS_BYTES_MAX {
                return Err(MdError::new(
                    errno::ENOSPC,
                    format!("{fid} would hold more than {XATTRS_BYTES_MAX} bytes of xattrs"),
                ));
            }
            tx.put_xattr(fid, &name, &value)?;
            a.ctime_ns = tx.now;
            tx.put(&a, p)?;
            Ok(Answer::Done)
        });
        Ok((change, weight))
    }

    pub fn removexattr(&self, cred: &Cred, fid: Fid, name: &str, key: Option<ReplyKey>) -> Result<()> {
        self.change(key, self.removexattr_change(cred, fid, name)?)?;
        Ok(())
    }

    /// The change `removexattr` makes (after checking access), for [`Namespace::submit`].
    pub fn removexattr_change(&self, cred: &Cred, fid: Fid, name: &str) -> Result<Change> {
        let a = self.getattr(fid)?;
        self.xattr_access(cred, &a, name, W)?;
        let name = name.to_string();
        Ok(Box::new(move |tx| {
            let (mut a, p) = tx.get(fid)?;
            if !tx.del_xattr(fid, &name)? {
                return Err(MdError::new(errno::ENODATA, format!("{fid} has no xattr {name}")));
            }
            a.ctime_ns = tx.now;
            tx.put(&a, p)?;
            Ok(Answer::Done)
        }))
    }
}
