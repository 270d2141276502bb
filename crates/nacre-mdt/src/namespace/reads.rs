//! Reads: attributes, lookups, listings, symlinks, xattrs and layouts, answered from
//! memory under the namespace's read lock.

use super::*;

impl Namespace {
    pub(super) fn read_inode(&self, fid: Fid) -> Result<(Attr, Fid)> {
        let m = read(&self.mem);
        let i = m.inode(fid.key()).ok_or_else(|| MdError::new(errno::ENOENT, format!("no inode {fid}")))?;
        Ok((i.attr, i.parent))
    }

    pub fn getattr(&self, fid: Fid) -> Result<Attr> {
        Ok(self.read_inode(fid)?.0)
    }

    /// The entry `name` of `dir` with its attributes; needs search (X) permission on `dir`.
    pub fn lookup(&self, cred: &Cred, dir: Fid, name: &str) -> Result<Attr> {
        name_fits(name)?;
        let mut one = self.lookup_many(cred, dir, &[name])?;
        one.pop().unwrap_or_else(|| Err(storage("a lookup of one name answered none")))
    }

    /// Each of `names` in `dir`, in one read transaction (the client's statahead). The
    /// directory's own errors (missing, not a directory, no search permission, striped
    /// here) fail the whole call; a name's own (missing, too long) is its answer alone.
    pub fn lookup_many<S: AsRef<str>>(&self, cred: &Cred, dir: Fid, names: &[S]) -> Result<Vec<Result<Attr>>> {
        let m = read(&self.mem);
        let get = |f: Fid| -> Result<(Attr, Fid)> {
            let i = m.inode(f.key()).ok_or_else(|| MdError::new(errno::ENOENT, format!("no inode {f}")))?;
            Ok((i.attr, i.parent))
        };
        let (d, parent) = get(dir)?;
        if !mode::is_dir(d.mode) {
            return Err(MdError::new(errno::ENOTDIR, format!("{dir} is not a directory")));
        }
        if !may_acl(&m, cred, &d, X) {
            return Err(denied(cred, "search", &d));
        }
        if names.iter().any(|n| !matches!(n.as_ref(), "." | "..")) {
            striped_here(&m, dir)?;
        }
        let one = |name: &str| -> Result<Attr> {
            name_fits(name)?;
            let (child, kind) = match name {
                "." => (dir, mode::S_IFDIR),
                ".." => (parent, mode::S_IFDIR),
                _ => {
                    let (f, k) = m
                        .entry(dir.key(), cookie_of(name), name)
                        .ok_or_else(|| MdError::new(errno::ENOENT, format!("no {name:?} in {dir}")))?;
                    (Fid::from_key(f), k)
                }
            };
            if child.mdt() != Some(self.index) {
                // Lustre's answer for a remote entry: its FID, whose sequence names the
                // MDT that has its attributes.
                return Ok(remote_attr(child, kind));
            }
            Ok(get(child)?.0)
        };
        Ok(names.iter().map(|n| one(n.as_ref())).collect())
    }

    /// Up to `max` entries of `dir` after `cookie` (0 starts), each with its attributes;
    /// `true` once the listing is complete. Needs read permission on `dir`.
    pub fn readdir(&self, cred: &Cred, dir: Fid, cookie: u64, max: usize) -> Result<(Vec<(DirEntry, Attr)>, bool)> {
        self.readdir_bounded(cred, dir, cookie, max, usize::MAX)
    }

    /// As [`Namespace::readdir`], with the page also bounded to about `max_bytes` of
    /// names and attributes ([`READDIR_ENTRY_BYTES`] plus the name per entry), so that it
    /// fits one reply.
    pub fn readdir_bounded(
        &self,
        cred: &Cred,
        dir: Fid,
        cookie: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<(Vec<(DirEntry, Attr)>, bool)> {
        let m = read(&self.mem);
        let d = m.inode(dir.key()).ok_or_else(|| MdError::new(errno::ENOENT, format!("no inode {dir}")))?.attr;
        if !mode::is_dir(d.mode) {
            return Err(MdError::new(errno::ENOTDIR, format!("{dir} is not a directory")));
        }
        if !may_acl(&m, cred, &d, R) {
            return Err(denied(cred, "list", &d));
        }
        striped_here(&m, dir)?;
        let mut out = Vec::new();
        let mut last = None;
        let mut bytes = 0usize;
        for (hash, e) in m.entries_after(dir.key(), cookie) {
            let name = &*e.name;
            bytes += READDIR_ENTRY_BYTES + name.len();
            if out.len() >= max.max(1) || (!out.is_empty() && bytes > max_bytes) {
                // Never split a group of equal hashes (the cookie could not resume inside
                // it): a page that would end inside one ends before it instead.
                if last != Some(hash) {
                    return Ok((out, false));
                }
                let keep = out.iter().take_while(|(e, _)| e.cookie != hash).count();
                if keep > 0 {
                    out.truncate(keep);
                    return Ok((out, false));
                }
            }
            let (child, kind) = (Fid::from_key(e.child), e.kind);
            let a = match m.inode(e.child) {
                Some(i) => i.attr,
                None if child.mdt() != Some(self.index) => remote_attr(child, kind),
                None => continue,
            };
            out.push((DirEntry { name: name.to_string(), fid: child, kind, cookie: hash }, a));
            last = Some(hash);
        }
        Ok((out, true))
    }

    pub fn readlink(&self, fid: Fid) -> Result<Vec<u8>> {
        self.getattr(fid)?;
        match read(&self.mem).symlinks.get(&fid.key()) {
            Some(v) => Ok(v.to_vec()),
            None => Err(MdError::new(errno::EINVAL, format!("{fid} is not a symlink"))),
        }
    }

    pub(super) fn xattr_access(&self, cred: &Cred, a: &Attr, name: &str, want: u32) -> Result<()> {
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return Err(MdError::new(errno::ERANGE, format!("xattr name of {} bytes", name.len())));
        }
        if name == acl::ACCESS || name == acl::DEFAULT {
            // As Linux: anyone may read an ACL; its owner (or root) sets it, and only a
            // directory has a default one.
            if want & W != 0 && cred.uid != 0 && cred.uid != a.uid {
                return Err(MdError::new(errno::EPERM, format!("uid {} does not own {}: no ACL", cred.uid, a.fid)));
            }
            if want & W != 0 && name == acl::DEFAULT && !mode::is_dir(a.mode) {
                return Err(MdError::new(errno::EACCES, format!("{} is not a directory: no default ACL", a.fid)));
            }
            return Ok(());
        }
        if name.starts_with("trusted.") || name.starts_with("security.") {
            if cred.uid != 0 && (want & W != 0 || name.starts_with("trusted.")) {
                return Err(MdError::new(errno::EPERM, format!("uid {} may not touch {name}", cred.uid)));
            }
            return Ok(());
        }
        if !name.starts_with("user.") {
            return Err(MdError::new(errno::EOPNOTSUPP, format!("xattr namespace of {name:?} is not supported")));
        }
        if !mode::is_reg(a.mode) && !mode::is_dir(a.mode) {
            // As Linux: user xattrs only on files and directories.
            return Err(MdError::new(
                errno::EPERM,
                format!("{} is neither a file nor a directory: no user xattrs", a.fid),
            ));
        }
        if !may_acl(&read(&self.mem), cred, a, want) {
            return Err(denied(cred, if want & W != 0 { "set xattrs of" } else { "read xattrs of" }, a));
        }
        Ok(())
    }

    pub fn getxattr(&self, cred: &Cred, fid: Fid, name: &str) -> Result<Vec<u8>> {
        let a = self.getattr(fid)?;
        if name == LAYOUT_XATTR {
            // The layout, as Lustre shows it through `lustre.lov` (here in Nacre's
            // encoding): what tools use to copy a file's striping.
            return match self.layout(fid)? {
                Some(l) => Ok(l.encode()),
                None => Err(MdError::new(errno::ENODATA, format!("{fid} has no layout"))),
            };
        }
        self.xattr_access(cred, &a, name, R)?;
        match read(&self.mem).xattr(fid.key(), name) {
            Some(v) => Ok(v.to_vec()),
            None => Err(MdError::new(errno::ENODATA, format!("{fid} has no xattr {name}"))),
        }
    }

    /// Names of the xattrs the caller may see.
    pub fn listxattr(&self, cred: &Cred, fid: Fid) -> Result<Vec<String>> {
        self.getattr(fid)?;
        let m = read(&self.mem);
        Ok(m.xattrs_of(fid.key())
            .filter(|(n, _)| !n.starts_with("trusted.") || cred.uid == 0)
            .map(|(n, _)| n.to_string())
            .collect())
    }

    /// Inodes in use, and the bytes the image and the DoM area occupy of the room they
    /// share.
    pub fn statfs(&self) -> Result<MdtStatFs> {
        Ok(MdtStatFs {
            inodes: read(&self.mem).inode_count(),
            bytes_used: self.db_len.load(std::sync::atomic::Ordering::Acquire) + lock(&self.area).used(),
            bytes_total: self.capacity,
        })
    }

    /// The layout of a file, or the default layout of a directory (`None`: it has none
    /// and its files inherit the file system's).
    pub fn layout(&self, fid: Fid) -> Result<Option<Layout>> {
        self.getattr(fid)?;
        match read(&self.mem).layout(fid.key()) {
            Some(v) => Ok(Some(Layout::decode(v)?)),
            None => Ok(None),
        }
    }

    /// Reply records kept for `client`.
    pub fn reply_records(&self, client: u64) -> Result<usize> {
        Ok(read(&self.mem).reply_count(client))
    }
}
