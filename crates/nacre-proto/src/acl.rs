//! POSIX ACLs as Linux keeps them in the `system.posix_acl_access` and
//! `system.posix_acl_default` xattrs: the format (a version-2 header, then entries of a
//! tag, permissions and an id, sorted), its checks, and what the rules make of them:
//! the mode an access ACL implies, a chmod, the ACL a new file inherits, and the access
//! check. The MDT stores the xattrs as they come and uses these to enforce them.

/// The access ACL's xattr.
pub const ACCESS: &str = "system.posix_acl_access";
/// A directory's default ACL, inherited by what is made in it.
pub const DEFAULT: &str = "system.posix_acl_default";

const VERSION: u32 = 2;
pub const USER_OBJ: u16 = 0x01;
pub const USER: u16 = 0x02;
pub const GROUP_OBJ: u16 = 0x04;
pub const GROUP: u16 = 0x08;
pub const MASK: u16 = 0x10;
pub const OTHER: u16 = 0x20;
/// The id of entries that name nobody (the owner, the owning group, mask, other).
const UNDEFINED_ID: u32 = u32::MAX;
/// Entries one ACL may hold (ext4 takes about 500 in a 4 KiB block; XFS allows 25,000).
pub const ENTRIES_MAX: usize = 1024;

/// One entry: whom it is for (`tag`, and `id` for a named user or group) and its
/// permissions (r = 4, w = 2, x = 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// A POSIX ACL: its entries, sorted by tag and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    pub entries: Vec<Entry>,
}

impl Acl {
    /// An ACL from its xattr value, checked as Linux's `posix_acl_valid` checks it: the
    /// owner, owning group and other entries once each, a mask if any user or group is
    /// named (at most one), named ids once per tag, entries in order, permissions rwx.
    pub fn from_xattr(b: &[u8]) -> Result<Acl, String> {
        if b.len() < 4 || !(b.len() - 4).is_multiple_of(8) {
            return Err(format!("an ACL of {} bytes (a 4-byte header and 8-byte entries)", b.len()));
        }
        let version = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if version != VERSION {
            return Err(format!("ACL version {version} (this reads version {VERSION})"));
        }
        let n = (b.len() - 4) / 8;
        if n > ENTRIES_MAX {
            return Err(format!("an ACL of {n} entries (at most {ENTRIES_MAX})"));
        }
        let entries: Vec<Entry> = b[4..]
            .chunks_exact(8)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        let acl = Acl { entries };
        acl.check()?;
        Ok(acl)
    }

    fn check(&self) -> Result<(), String> {
        let count = |t| self.entries.iter().filter(|e| e.tag == t).count();
        for (t, what) in [(USER_OBJ, "owner"), (GROUP_OBJ, "owning group"), (OTHER, "other")] {
            if count(t) != 1 {
                return Err(format!("an ACL needs one {what} entry, not {}", count(t)));
            }
        }
        let named = count(USER) + count(GROUP);
        if count(MASK) > 1 || (named > 0 && count(MASK) == 0) {
            return Err("an ACL with named users or groups needs one mask entry".into());
        }
        let mut last: Option<(u16, u32)> = None;
        for e in &self.entries {
            if ![USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER].contains(&e.tag) {
                return Err(format!("ACL entry tag {:#x}", e.tag));
            }
            if e.perm & !7 != 0 {
                return Err(format!("ACL entry permissions {:#o}", e.perm));
            }
            let id = if matches!(e.tag, USER | GROUP) { e.id } else { UNDEFINED_ID };
            if last.is_some_and(|l| l >= (e.tag, id)) {
                return Err("ACL entries out of order, or an id named twice".into());
            }
            last = Some((e.tag, id));
        }
        Ok(())
    }

    pub fn to_xattr(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(4 + 8 * self.entries.len());
        b.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            let id = if matches!(e.tag, USER | GROUP) { e.id } else { UNDEFINED_ID };
            b.extend_from_slice(&e.tag.to_le_bytes());
            b.extend_from_slice(&e.perm.to_le_bytes());
            b.extend_from_slice(&id.to_le_bytes());
        }
        b
    }

    fn perm(&self, tag: u16) -> Option<u32> {
        self.entries.iter().find(|e| e.tag == tag).map(|e| u32::from(e.perm))
    }

    fn set(&mut self, tag: u16, perm: u32) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.tag == tag) {
            e.perm = (perm & 7) as u16;
        }
    }

    /// The permission bits (0o777) this access ACL gives the mode: the owner's, the
    /// mask's (or the owning group's without one) as the group's, and other's.
    pub fn mode_bits(&self) -> u32 {
        let group = self.perm(MASK).or(self.perm(GROUP_OBJ)).unwrap_or(0);
        (self.perm(USER_OBJ).unwrap_or(0) << 6) | (group << 3) | self.perm(OTHER).unwrap_or(0)
    }

    /// Does the mode say all this ACL says (no named entries, no mask)? Then it need
    /// not be kept: Linux keeps none for such an ACL.
    pub fn is_mode(&self) -> bool {
        self.entries.iter().all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER))
    }

    /// A chmod to the permission bits `mode`: the owner, other, and the mask (or the
    /// owning group without one) entries take them (Linux's `posix_acl_chmod`).
    pub fn chmod(&mut self, mode: u32) {
        self.set(USER_OBJ, mode >> 6);
        let group = if self.perm(MASK).is_some() { MASK } else { GROUP_OBJ };
        self.set(group, mode >> 3);
        self.set(OTHER, mode);
    }

    /// What a new inode made with permission bits `mode` in a directory of this default
    /// ACL gets: its access ACL (each class limited by `mode`, as Linux's
    /// `posix_acl_create`) and its permission bits, from that ACL.
    pub fn inherit(&self, mode: u32) -> (Acl, u32) {
        let mut a = self.clone();
        let limit = |a: &mut Acl, tag, shift: u32| {
            if let Some(p) = a.perm(tag) {
                a.set(tag, p & (mode >> shift));
            }
        };
        limit(&mut a, USER_OBJ, 6);
        let group = if a.perm(MASK).is_some() { MASK } else { GROUP_OBJ };
        limit(&mut a, group, 3);
        limit(&mut a, OTHER, 0);
        let bits = a.mode_bits();
        (a, bits)
    }

    /// May a caller of `uid`, in the groups `in_group` says, do `want` (r = 4, w = 2,
    /// x = 1) to an inode owned by `owner`:`group` with this access ACL (POSIX.1e's
    /// algorithm: the owner entry for the owner; a named user's entry within the mask;
    /// any matching group entry within the mask; else other)?
    pub fn permits(&self, uid: u32, in_group: impl Fn(u32) -> bool, owner: u32, group: u32, want: u32) -> bool {
        if uid == owner {
            return self.perm(USER_OBJ).unwrap_or(0) & want == want;
        }
        let mask = self.perm(MASK).unwrap_or(7);
        if let Some(e) = self.entries.iter().find(|e| e.tag == USER && e.id == uid) {
            return u32::from(e.perm) & mask & want == want;
        }
        let mut in_a_group = false;
        for e in &self.entries {
            let member = match e.tag {
                GROUP_OBJ => in_group(group),
                GROUP => in_group(e.id),
                _ => false,
            };
            if member {
                if u32::from(e.perm) & mask & want == want {
                    return true;
                }
                in_a_group = true;
            }
        }
        !in_a_group && self.perm(OTHER).unwrap_or(0) & want == want
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tag: u16, perm: u16, id: u32) -> Entry {
        Entry { tag, perm, id }
    }

    fn acl(entries: &[Entry]) -> Acl {
        Acl { entries: entries.to_vec() }
    }

    #[test]
    fn the_format_round_trips_and_bad_acls_are_refused_by_name() {
        let a = acl(&[
            e(USER_OBJ, 7, UNDEFINED_ID),
            e(USER, 5, 1000),
            e(GROUP_OBJ, 5, UNDEFINED_ID),
            e(GROUP, 6, 27),
            e(MASK, 7, UNDEFINED_ID),
            e(OTHER, 0, UNDEFINED_ID),
        ]);
        assert_eq!(Acl::from_xattr(&a.to_xattr()), Ok(a.clone()));
        let bad = |entries: &[Entry]| Acl::from_xattr(&acl(entries).to_xattr()).unwrap_err();
        assert!(bad(&[e(USER_OBJ, 7, 0), e(OTHER, 0, 0)]).contains("owning group"));
        assert!(bad(&[e(USER_OBJ, 7, 0), e(USER, 7, 5), e(GROUP_OBJ, 5, 0), e(OTHER, 0, 0)]).contains("mask"));
        assert!(bad(&[e(USER_OBJ, 7, 0), e(GROUP_OBJ, 9, 0), e(OTHER, 0, 0)]).contains("permissions"));
        assert!(bad(&[e(GROUP_OBJ, 5, 0), e(USER_OBJ, 7, 0), e(OTHER, 0, 0)]).contains("order"));
        let twice =
            [e(USER_OBJ, 7, 0), e(USER, 7, 5), e(USER, 5, 5), e(GROUP_OBJ, 5, 0), e(MASK, 7, 0), e(OTHER, 0, 0)];
        assert!(bad(&twice).contains("order"));
        assert!(Acl::from_xattr(&[2, 0, 0, 0, 1]).unwrap_err().contains("5 bytes"));
        assert!(Acl::from_xattr(&[1, 0, 0, 0]).unwrap_err().contains("version 1"));
    }

    #[test]
    fn mode_chmod_inheritance_and_access_follow_posix() {
        let base = acl(&[e(USER_OBJ, 6, 0), e(GROUP_OBJ, 4, 0), e(OTHER, 4, 0)]);
        assert!(base.is_mode() && base.mode_bits() == 0o644);
        let mut a = acl(&[e(USER_OBJ, 7, 0), e(USER, 7, 1000), e(GROUP_OBJ, 5, 0), e(MASK, 5, 0), e(OTHER, 1, 0)]);
        assert_eq!(a.mode_bits(), 0o751);
        // A named user's rights stop at the mask: 1000 may read and execute, not write.
        assert!(a.permits(1000, |_| false, 0, 0, 5) && !a.permits(1000, |_| false, 0, 0, 2));
        // chmod sets the mask, not the owning group's entry.
        a.chmod(0o740);
        assert_eq!((a.perm(MASK), a.perm(GROUP_OBJ), a.perm(OTHER)), (Some(4), Some(5), Some(0)));
        assert!(!a.permits(1000, |_| false, 0, 0, 1), "x is masked now");
        // A group member with no matching right does not fall through to other.
        let g = acl(&[e(USER_OBJ, 7, 0), e(GROUP_OBJ, 0, 0), e(OTHER, 7, 0)]);
        assert!(!g.permits(5, |gid| gid == 100, 0, 100, 4));
        assert!(g.permits(5, |_| false, 0, 100, 4));
        // Inherited: each class limited by the mode asked for; the umask plays no part.
        let d = acl(&[e(USER_OBJ, 7, 0), e(GROUP, 7, 27), e(GROUP_OBJ, 7, 0), e(MASK, 7, 0), e(OTHER, 5, 0)]);
        let (child, bits) = d.inherit(0o666);
        assert_eq!(bits, 0o664);
        assert_eq!(child.perm(MASK), Some(6));
        assert_eq!(child.entries.iter().find(|x| x.tag == GROUP).map(|x| x.perm), Some(7), "named entries kept");
    }
}
