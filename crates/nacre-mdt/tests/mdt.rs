//! The MDT namespace: random operations against a model tree (seeded), the POSIX rules
//! one by one, replayed changes, open-unlinked files, restart, and group commit.

use std::collections::BTreeMap;
use std::sync::Arc;

use nacre_mdt::{Cred, FirstAnswer, MdError, Namespace, NamespaceOptions, RenameMode, ReplyKey, SetAttr};
use nacre_proto::acl;
use nacre_proto::fid::Fid;
use nacre_proto::layout::Layout;
use nacre_proto::mdt::{Attr, errno, mode};
use nacre_raid::{BlockDevice, CreateOptions, Level, MemDrive, Volume, VolumeOptions};

fn volume() -> Arc<Volume> {
    volume_of(4, 64 << 20, Level::Raid10)
}

/// An MDT volume of `n` memory drives of `bytes` each.
fn volume_of(n: usize, bytes: u64, level: Level) -> Arc<Volume> {
    let run = VolumeOptions { threads_per_drive: 1, ..VolumeOptions::default() };
    let devs: Vec<Arc<dyn BlockDevice>> =
        (0..n).map(|i| MemDrive::new(&format!("m{i}"), bytes) as Arc<dyn BlockDevice>).collect();
    let mut o = CreateOptions::new("mdt0", level);
    o.strip_bytes = 64 << 10;
    o.assume_clean = true;
    Arc::new(Volume::create(devs, &o, &run).unwrap())
}

fn ns() -> (Namespace, Arc<Volume>) {
    let v = volume();
    (Namespace::format(v.clone(), 0, NamespaceOptions::default()).unwrap(), v)
}

fn errno_of<T: std::fmt::Debug>(r: Result<T, MdError>) -> i32 {
    r.expect_err("expected an error").errno
}

const ROOT: Fid = Fid::ROOT;

fn root() -> Cred {
    Cred::root()
}

/// Every entry of `dir`, through pages of `page` entries.
fn list(ns: &Namespace, dir: Fid, page: usize) -> BTreeMap<String, Attr> {
    let mut out = BTreeMap::new();
    let mut cookie = 0;
    loop {
        let (entries, eof) = ns.readdir(&root(), dir, cookie, page).unwrap();
        for (e, a) in entries {
            assert!(e.cookie > cookie, "cookies grow");
            cookie = e.cookie;
            assert_eq!(e.fid, a.fid);
            assert_eq!(e.kind, a.mode & mode::S_IFMT);
            assert!(out.insert(e.name, a).is_none(), "an entry listed twice");
        }
        if eof {
            return out;
        }
    }
}

// ---- the model ----

#[derive(Clone, Debug)]
struct Node {
    dir: bool,
    nlink: u32,
    parent: usize,
    children: BTreeMap<String, usize>,
    size: u64,
}

struct Model {
    nodes: Vec<Option<Node>>,
    fids: Vec<Fid>,
}

impl Model {
    fn node(&self, id: usize) -> Option<&Node> {
        self.nodes.get(id).and_then(|n| n.as_ref())
    }

    fn is_below(&self, mut at: usize, ancestor: usize) -> bool {
        loop {
            if at == ancestor {
                return true;
            }
            if at == 0 {
                return false;
            }
            at = self.node(at).map_or(0, |n| n.parent);
        }
    }

    fn drop_link(&mut self, id: usize) {
        let n = self.nodes[id].as_mut().unwrap();
        if n.dir {
            self.nodes[id] = None;
            return;
        }
        n.nlink -= 1;
        if n.nlink == 0 {
            self.nodes[id] = None;
        }
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const NAMES: [&str; 6] = ["a", "b", "c", "dd", "e.txt", "f-long-name"];

fn run_model(seed: u64, ops: usize) {
    let (ns, v) = ns();
    let mut m = Model {
        nodes: vec![Some(Node { dir: true, nlink: 2, parent: 0, children: BTreeMap::new(), size: 0 })],
        fids: vec![ROOT],
    };
    let mut rng = Rng(seed | 1);
    let c = root();
    for step in 0..ops {
        // Directories that exist, and every id ever made (removed ones give ENOENT).
        let dirs: Vec<usize> = (0..m.nodes.len()).filter(|&i| m.node(i).is_some_and(|n| n.dir)).collect();
        let any = |rng: &mut Rng| rng.below(m.fids.len());
        let d = if rng.below(10) == 0 { any(&mut rng) } else { dirs[rng.below(dirs.len())] };
        let name = NAMES[rng.below(NAMES.len())];
        let op = rng.below(8);
        let what = format!("seed {seed} step {step} op {op} dir {d} name {name}");
        let dir_ok = m.node(d).is_some_and(|n| n.dir);
        let existing = m.node(d).and_then(|n| n.children.get(name).copied());
        match op {
            0 | 1 => {
                let mkdir = op == 1;
                let r = if mkdir {
                    ns.mkdir(&c, m.fids[d], name, 0o755, None)
                } else {
                    ns.create(&c, m.fids[d], name, 0o644, None)
                };
                if m.node(d).is_none() {
                    assert_eq!(errno_of(r), errno::ENOENT, "{what}");
                } else if !dir_ok {
                    assert_eq!(errno_of(r), errno::ENOTDIR, "{what}");
                } else if existing.is_some() {
                    assert_eq!(errno_of(r), errno::EEXIST, "{what}");
                } else {
                    let a = r.unwrap_or_else(|e| panic!("{what}: {e}"));
                    let id = m.nodes.len();
                    m.nodes.push(Some(Node {
                        dir: mkdir,
                        nlink: if mkdir { 2 } else { 1 },
                        parent: d,
                        children: BTreeMap::new(),
                        size: 0,
                    }));
                    m.fids.push(a.fid);
                    let p = m.nodes[d].as_mut().unwrap();
                    p.children.insert(name.into(), id);
                    if mkdir {
                        p.nlink += 1;
                    }
                }
            }
            2 | 3 => {
                let rmdir = op == 3;
                let r = ns.remove(&c, m.fids[d], name, rmdir, None);
                if m.node(d).is_none() {
                    assert_eq!(errno_of(r), errno::ENOENT, "{what}");
                } else if !dir_ok {
                    assert_eq!(errno_of(r), errno::ENOTDIR, "{what}");
                } else if let Some(id) = existing {
                    let n = m.node(id).unwrap().clone();
                    if rmdir && !n.dir {
                        assert_eq!(errno_of(r), errno::ENOTDIR, "{what}");
                    } else if !rmdir && n.dir {
                        assert_eq!(errno_of(r), errno::EISDIR, "{what}");
                    } else if n.dir && !n.children.is_empty() {
                        assert_eq!(errno_of(r), errno::ENOTEMPTY, "{what}");
                    } else {
                        r.unwrap_or_else(|e| panic!("{what}: {e}"));
                        let p = m.nodes[d].as_mut().unwrap();
                        p.children.remove(name);
                        if n.dir {
                            p.nlink -= 1;
                        }
                        m.drop_link(id);
                    }
                } else {
                    assert_eq!(errno_of(r), errno::ENOENT, "{what}");
                }
            }
            4 | 5 => {
                let dd = dirs[rng.below(dirs.len())];
                let dname = NAMES[rng.below(NAMES.len())];
                let how = if op == 4 { RenameMode::Replace } else { RenameMode::NoReplace };
                let what = format!("{what} -> {dd}/{dname} {how:?}");
                let r = ns.rename(&c, m.fids[d], name, m.fids[dd], dname, how, None);
                let victim = m.node(dd).unwrap().children.get(dname).copied();
                if m.node(d).is_none() {
                    assert_eq!(errno_of(r), errno::ENOENT, "{what}");
                } else if !dir_ok {
                    assert_eq!(errno_of(r), errno::ENOTDIR, "{what}");
                } else if let Some(src) = existing {
                    let sn = m.node(src).unwrap().clone();
                    if victim.is_some() && how == RenameMode::NoReplace {
                        assert_eq!(errno_of(r), errno::EEXIST, "{what}");
                    } else if victim == Some(src) {
                        r.unwrap_or_else(|e| panic!("{what}: {e}"));
                    } else if sn.dir && dd != d && m.is_below(dd, src) {
                        assert_eq!(errno_of(r), errno::EINVAL, "{what}");
                    } else if let Some(v) = victim.map(|v| (v, m.node(v).unwrap().clone()))
                        && (sn.dir != v.1.dir || (v.1.dir && !v.1.children.is_empty()))
                    {
                        let want = if sn.dir && !v.1.dir {
                            errno::ENOTDIR
                        } else if !sn.dir && v.1.dir {
                            errno::EISDIR
                        } else {
                            errno::ENOTEMPTY
                        };
                        assert_eq!(errno_of(r), want, "{what}");
                    } else {
                        r.unwrap_or_else(|e| panic!("{what}: {e}"));
                        m.nodes[d].as_mut().unwrap().children.remove(name);
                        if let Some(v) = victim {
                            let vdir = m.node(v).unwrap().dir;
                            m.nodes[dd].as_mut().unwrap().children.remove(dname);
                            if vdir {
                                m.nodes[dd].as_mut().unwrap().nlink -= 1;
                            }
                            m.drop_link(v);
                        }
                        m.nodes[dd].as_mut().unwrap().children.insert(dname.into(), src);
                        if sn.dir {
                            m.nodes[d].as_mut().unwrap().nlink -= 1;
                            m.nodes[dd].as_mut().unwrap().nlink += 1;
                            m.nodes[src].as_mut().unwrap().parent = dd;
                        }
                    }
                } else {
                    assert_eq!(errno_of(r), errno::ENOENT, "{what}");
                }
            }
            6 => {
                // A hard link to some live inode.
                let live: Vec<usize> = (0..m.nodes.len()).filter(|&i| m.node(i).is_some()).collect();
                let t = live[rng.below(live.len())];
                let r = ns.link(&c, m.fids[t], m.fids[d], name, None);
                if m.node(d).is_none() {
                    assert_eq!(errno_of(r), errno::ENOENT, "{what}");
                } else if !dir_ok {
                    assert_eq!(errno_of(r), errno::ENOTDIR, "{what}");
                } else if m.node(t).unwrap().dir {
                    assert_eq!(errno_of(r), errno::EPERM, "{what}");
                } else if existing.is_some() {
                    assert_eq!(errno_of(r), errno::EEXIST, "{what}");
                } else {
                    r.unwrap_or_else(|e| panic!("{what}: {e}"));
                    m.nodes[t].as_mut().unwrap().nlink += 1;
                    m.nodes[d].as_mut().unwrap().children.insert(name.into(), t);
                }
            }
            _ => {
                // Truncate a file to a random size.
                let files: Vec<usize> = (0..m.nodes.len()).filter(|&i| m.node(i).is_some_and(|n| !n.dir)).collect();
                if files.is_empty() {
                    continue;
                }
                let f = files[rng.below(files.len())];
                let size = rng.next() % (1 << 40);
                let a = ns.setattr(&c, m.fids[f], SetAttr { size: Some(size), ..SetAttr::default() }, None).unwrap();
                assert_eq!(a.size, size);
                m.nodes[f].as_mut().unwrap().size = size;
            }
        }
        if step % 97 == 0 || step + 1 == ops {
            compare(&ns, &m, 0, &format!("seed {seed} after step {step}"));
        }
    }
    let inodes = m.nodes.iter().filter(|n| n.is_some()).count() as u64;
    assert_eq!(ns.statfs().unwrap().inodes, inodes, "inodes leaked or lost");
    // A crash: nothing of the namespace runs its shutdown (redb's last commits were not
    // durable; the writes waiting for a sync never reach the volume). Reopened, redb is
    // at its last checkpoint and the redo log brings back everything after it.
    let logged = ns.stats.checkpoints.load(std::sync::atomic::Ordering::Relaxed);
    ns.crash();
    let ns = Namespace::open(v, NamespaceOptions::default()).unwrap();
    compare(&ns, &m, 0, &format!("seed {seed} after a crash ({logged} checkpoints before it)"));
    assert_eq!(ns.statfs().unwrap().inodes, inodes, "inodes leaked or lost in the crash");
    // FIDs are reserved ahead in stretches: after the crash none is handed out again.
    let n = ns.create(&root(), ROOT, "after-the-crash", 0o644, None).unwrap();
    assert!(!m.fids.contains(&n.fid) && n.fid > *m.fids.iter().max().unwrap(), "FID {} reused", n.fid);
}

/// Walk the namespace and the model together.
fn compare(ns: &Namespace, m: &Model, id: usize, what: &str) {
    let n = m.node(id).unwrap();
    let a = ns.getattr(m.fids[id]).unwrap();
    assert_eq!(a.nlink, n.nlink, "{what}: nlink of {}", m.fids[id]);
    assert_eq!(mode::is_dir(a.mode), n.dir, "{what}");
    if !n.dir {
        assert_eq!(a.size, n.size, "{what}: size of {}", m.fids[id]);
        return;
    }
    let listed = list(ns, m.fids[id], 2);
    let names: Vec<&String> = listed.keys().collect();
    let want: Vec<&String> = n.children.keys().collect();
    assert_eq!(names, want, "{what}: entries of {}", m.fids[id]);
    for (name, &child) in &n.children {
        assert_eq!(listed[name].fid, m.fids[child], "{what}: {name}");
        assert_eq!(ns.lookup(&root(), m.fids[id], name).unwrap().fid, m.fids[child]);
        if m.node(child).unwrap().dir {
            assert_eq!(ns.lookup(&root(), m.fids[child], "..").unwrap().fid, m.fids[id], "{what}: .. of {name}");
            compare(ns, m, child, what);
        } else {
            compare(ns, m, child, what);
        }
    }
}

#[test]
fn random_operations_match_the_model() {
    for seed in [1, 2, 3, 0xdead_beef] {
        run_model(seed, 1500);
    }
}

#[test]
fn names_are_checked() {
    let (ns, _v) = ns();
    let c = root();
    let long = "x".repeat(256);
    assert_eq!(errno_of(ns.create(&c, ROOT, &long, 0o644, None)), errno::ENAMETOOLONG);
    assert_eq!(errno_of(ns.lookup(&c, ROOT, &long)), errno::ENAMETOOLONG);
    ns.create(&c, ROOT, &"x".repeat(255), 0o644, None).unwrap();
    for bad in ["", ".", "..", "a/b", "nul\0"] {
        let e = ns.create(&c, ROOT, bad, 0o644, None).unwrap_err();
        assert_eq!(e.errno, errno::EINVAL, "{bad:?}: {e}");
    }
    let f = ns.create(&c, ROOT, "file", 0o644, None).unwrap();
    assert_eq!(errno_of(ns.create(&c, f.fid, "x", 0o644, None)), errno::ENOTDIR);
    assert_eq!(errno_of(ns.lookup(&c, ROOT, "missing")), errno::ENOENT);
    assert_eq!(errno_of(ns.getattr(Fid::new(Fid::seq_of(0, 0), 999))), errno::ENOENT);
    // Nothing above left anything behind: the root, the 255-byte name and "file".
    assert_eq!(ns.statfs().unwrap().inodes, 3);
}

/// Several names of one directory in one call (the client's statahead): each name gets
/// the answer a lookup of its own gives, a missing or over-long name fails alone, and the
/// directory's own errors fail the whole call.
#[test]
fn lookup_many_answers_each_name_as_a_lookup_would() {
    let (ns, _v) = ns();
    let c = root();
    let d = ns.mkdir(&c, ROOT, "d", 0o700, None).unwrap();
    for i in 0..5 {
        ns.create(&c, d.fid, &format!("f{i}"), 0o644, None).unwrap();
    }
    let long = "x".repeat(256);
    let names = ["f0", "f4", "missing", long.as_str(), ".", "..", "f2"];
    let got = ns.lookup_many(&c, d.fid, &names).unwrap();
    assert_eq!(got.len(), names.len());
    for (name, r) in names.iter().zip(&got) {
        match ns.lookup(&c, d.fid, name) {
            Ok(a) => assert_eq!(r.as_ref().ok(), Some(&a), "{name}"),
            Err(e) => assert_eq!(r.as_ref().err().map(|x| x.errno), Some(e.errno), "{name}"),
        }
    }
    assert_eq!(got[2].as_ref().unwrap_err().errno, errno::ENOENT);
    assert_eq!(got[3].as_ref().unwrap_err().errno, errno::ENAMETOOLONG);
    assert_eq!(got[4].as_ref().unwrap().fid, d.fid);
    assert_eq!(got[5].as_ref().unwrap().fid, ROOT);
    assert!(ns.lookup_many::<&str>(&c, d.fid, &[]).unwrap().is_empty());
    // The directory's errors: not a directory, missing, no search permission.
    let f0 = got[0].as_ref().unwrap().fid;
    assert_eq!(errno_of(ns.lookup_many(&c, f0, &["x"])), errno::ENOTDIR);
    assert_eq!(errno_of(ns.lookup_many(&c, Fid::new(Fid::seq_of(0, 0), 999), &["x"])), errno::ENOENT);
    assert_eq!(errno_of(ns.lookup_many(&Cred::user(1000, 100), d.fid, &["f0"])), errno::EACCES);
}

#[test]
fn permissions_and_sticky_directories() {
    let (ns, _v) = ns();
    let (alice, bob) = (Cred::user(1000, 100), Cred::user(1001, 101));
    let tmp = ns.mkdir(&root(), ROOT, "tmp", 0o1777, None).unwrap();
    let home = ns.mkdir(&root(), ROOT, "home", 0o755, None).unwrap();
    // Only root may write in a 0755 root-owned directory.
    assert_eq!(errno_of(ns.create(&alice, home.fid, "x", 0o644, None)), errno::EACCES);
    let af = ns.create(&alice, tmp.fid, "alice", 0o600, None).unwrap();
    assert_eq!((af.uid, af.gid), (1000, 100));
    // Sticky: bob may not remove or rename alice's file, alice may.
    assert_eq!(errno_of(ns.remove(&bob, tmp.fid, "alice", false, None)), errno::EPERM);
    assert_eq!(errno_of(ns.rename(&bob, tmp.fid, "alice", tmp.fid, "b", RenameMode::Replace, None)), errno::EPERM);
    // Mode 0600: bob may neither open nor chmod it; alice may.
    assert_eq!(errno_of(ns.open_file(1, &bob, af.fid, true, false)), errno::EACCES);
    assert_eq!(
        errno_of(ns.setattr(&bob, af.fid, SetAttr { mode: Some(0o666), ..Default::default() }, None)),
        errno::EPERM
    );
    let a = ns.setattr(&alice, af.fid, SetAttr { mode: Some(0o640), ..Default::default() }, None).unwrap();
    assert_eq!(a.mode, mode::S_IFREG | 0o640);
    // chown: only root gives files away; the owner may pick a group of hers.
    assert_eq!(
        errno_of(ns.setattr(&alice, af.fid, SetAttr { uid: Some(1001), ..Default::default() }, None)),
        errno::EPERM
    );
    assert_eq!(
        errno_of(ns.setattr(&alice, af.fid, SetAttr { gid: Some(7), ..Default::default() }, None)),
        errno::EPERM
    );
    let alice2 = Cred { groups: vec![7], ..alice.clone() };
    assert_eq!(ns.setattr(&alice2, af.fid, SetAttr { gid: Some(7), ..Default::default() }, None).unwrap().gid, 7);
    // Times: "now" needs write permission, explicit times need ownership.
    let g = ns.create(&root(), tmp.fid, "shared", 0o666, None).unwrap();
    ns.setattr(&bob, g.fid, SetAttr { mtime_ns: Some(None), ..Default::default() }, None).unwrap();
    assert_eq!(
        errno_of(ns.setattr(&bob, g.fid, SetAttr { mtime_ns: Some(Some(5)), ..Default::default() }, None)),
        errno::EPERM
    );
    let t = ns
        .setattr(
            &root(),
            g.fid,
            SetAttr { mtime_ns: Some(Some(5)), atime_ns: Some(Some(6)), ..Default::default() },
            None,
        )
        .unwrap();
    assert_eq!((t.mtime_ns, t.atime_ns), (5, 6));
    // Truncate needs write permission; directories cannot be truncated.
    assert_eq!(
        errno_of(ns.setattr(&bob, af.fid, SetAttr { size: Some(0), ..Default::default() }, None)),
        errno::EACCES
    );
    assert_eq!(
        errno_of(ns.setattr(&root(), tmp.fid, SetAttr { size: Some(0), ..Default::default() }, None)),
        errno::EISDIR
    );
    // Search permission: bob cannot look into a 0700 directory of alice's.
    let private = ns.mkdir(&alice, tmp.fid, "private", 0o700, None).unwrap();
    ns.create(&alice, private.fid, "secret", 0o644, None).unwrap();
    assert_eq!(errno_of(ns.lookup(&bob, private.fid, "secret")), errno::EACCES);
    assert_eq!(errno_of(ns.readdir(&bob, private.fid, 0, 10)), errno::EACCES);
    assert_eq!(ns.lookup(&alice, private.fid, "secret").unwrap().uid, 1000);
    // Setgid directories hand down their group and the bit.
    // mkdir takes no setgid from its caller (as Linux); chmod sets it.
    let sg = ns.mkdir(&root(), ROOT, "sg", 0o2777, None).unwrap();
    assert_eq!(sg.mode & mode::S_ISGID, 0);
    ns.setattr(&root(), sg.fid, SetAttr { gid: Some(55), mode: Some(0o2777), ..Default::default() }, None).unwrap();
    assert_eq!(ns.create(&alice, sg.fid, "f", 0o644, None).unwrap().gid, 55);
    let sub = ns.mkdir(&alice, sg.fid, "d", 0o755, None).unwrap();
    assert_eq!((sub.gid, sub.mode & mode::S_ISGID), (55, mode::S_ISGID));
}

/// In a sticky directory, removing or replacing another user's entry is EPERM before
/// anything else is said of it (its type, whether it is empty), as Linux's may_delete
/// checks the sticky bit first (checked on this machine's ext4 as uid 1000).
#[test]
fn the_sticky_bit_is_checked_before_type_and_emptiness() {
    let (ns, _v) = ns();
    let (alice, bob) = (Cred::user(1000, 100), Cred::user(1001, 101));
    let s = ns.mkdir(&root(), ROOT, "s", 0o1777, None).unwrap();
    let f = ns.create(&bob, s.fid, "f", 0o644, None).unwrap();
    let d = ns.mkdir(&bob, s.fid, "d", 0o755, None).unwrap();
    ns.create(&bob, d.fid, "x", 0o644, None).unwrap();
    ns.create(&alice, s.fid, "mine", 0o644, None).unwrap();
    ns.mkdir(&alice, s.fid, "mydir", 0o755, None).unwrap();
    let rename = |from: &str, to: &str| ns.rename(&alice, s.fid, from, s.fid, to, RenameMode::Replace, None);
    assert_eq!(errno_of(ns.remove(&alice, s.fid, "f", true, None)), errno::EPERM, "rmdir of bob's file");
    assert_eq!(errno_of(ns.remove(&alice, s.fid, "d", false, None)), errno::EPERM, "unlink of bob's directory");
    assert_eq!(errno_of(ns.remove(&alice, s.fid, "d", true, None)), errno::EPERM, "rmdir of bob's full directory");
    assert_eq!(errno_of(rename("mine", "d")), errno::EPERM, "a file over bob's directory");
    assert_eq!(errno_of(rename("mydir", "d")), errno::EPERM, "a directory over bob's full directory");
    // For bob the same calls meet the type and emptiness errors.
    assert_eq!(errno_of(ns.remove(&bob, s.fid, "f", true, None)), errno::ENOTDIR);
    assert_eq!(errno_of(ns.remove(&bob, s.fid, "d", false, None)), errno::EISDIR);
    assert_eq!(errno_of(ns.remove(&bob, s.fid, "d", true, None)), errno::ENOTEMPTY);
    // Nothing changed.
    assert_eq!(ns.lookup(&root(), s.fid, "f").unwrap().fid, f.fid);
    assert_eq!(ns.lookup(&root(), s.fid, "d").unwrap().fid, d.fid);
}

#[test]
fn rename_cases() {
    let (ns, _v) = ns();
    let c = root();
    let a = ns.mkdir(&c, ROOT, "a", 0o755, None).unwrap();
    let b = ns.mkdir(&c, a.fid, "b", 0o755, None).unwrap();
    let f = ns.create(&c, ROOT, "f", 0o644, None).unwrap();
    let g = ns.create(&c, ROOT, "g", 0o644, None).unwrap();
    // A directory into its own subtree.
    assert_eq!(errno_of(ns.rename(&c, ROOT, "a", b.fid, "x", RenameMode::Replace, None)), errno::EINVAL);
    // File over directory, directory over file, over a non-empty directory.
    assert_eq!(errno_of(ns.rename(&c, ROOT, "f", ROOT, "a", RenameMode::Replace, None)), errno::EISDIR);
    assert_eq!(errno_of(ns.rename(&c, a.fid, "b", ROOT, "f", RenameMode::Replace, None)), errno::ENOTDIR);
    ns.mkdir(&c, ROOT, "c", 0o755, None).unwrap();
    assert_eq!(errno_of(ns.rename(&c, ROOT, "c", ROOT, "a", RenameMode::Replace, None)), errno::ENOTEMPTY);
    // No-replace, then replace: g's inode goes, f takes its name.
    assert_eq!(errno_of(ns.rename(&c, ROOT, "f", ROOT, "g", RenameMode::NoReplace, None)), errno::EEXIST);
    ns.rename(&c, ROOT, "f", ROOT, "g", RenameMode::Replace, None).unwrap();
    assert_eq!(ns.lookup(&c, ROOT, "g").unwrap().fid, f.fid);
    assert_eq!(errno_of(ns.getattr(g.fid)), errno::ENOENT);
    // Moving a directory moves its ".." and both parents' link counts.
    let root_links = ns.getattr(ROOT).unwrap().nlink;
    ns.rename(&c, a.fid, "b", ROOT, "b2", RenameMode::Replace, None).unwrap();
    assert_eq!(ns.lookup(&c, b.fid, "..").unwrap().fid, ROOT);
    assert_eq!(ns.getattr(ROOT).unwrap().nlink, root_links + 1);
    assert_eq!(ns.getattr(a.fid).unwrap().nlink, 2);
    // Replacing an empty directory with a directory.
    ns.rename(&c, ROOT, "b2", ROOT, "c", RenameMode::Replace, None).unwrap();
    assert_eq!(ns.getattr(ROOT).unwrap().nlink, root_links);
    // Two names of one inode: nothing happens (no-replace still says EEXIST).
    ns.link(&c, f.fid, ROOT, "f2", None).unwrap();
    ns.rename(&c, ROOT, "g", ROOT, "f2", RenameMode::Replace, None).unwrap();
    assert_eq!(errno_of(ns.rename(&c, ROOT, "g", ROOT, "f2", RenameMode::NoReplace, None)), errno::EEXIST);
    assert_eq!(ns.getattr(f.fid).unwrap().nlink, 2);
    assert!(ns.lookup(&c, ROOT, "g").is_ok() && ns.lookup(&c, ROOT, "f2").is_ok());
}

#[test]
fn symlinks_xattrs_and_links() {
    let (ns, _v) = ns();
    let c = root();
    let l = ns.symlink(&c, ROOT, "l", b"../target", None).unwrap();
    assert!(mode::is_lnk(l.mode) && l.size == 9);
    assert_eq!(ns.readlink(l.fid).unwrap(), b"../target");
    assert_eq!(errno_of(ns.symlink(&c, ROOT, "l2", &[b'x'; 4096], None)), errno::ENAMETOOLONG);
    assert_eq!(errno_of(ns.readlink(ROOT)), errno::EINVAL);
    let f = ns.create(&c, ROOT, "f", 0o644, None).unwrap();
    ns.setxattr(&c, f.fid, "user.a", b"1", false, false, None).unwrap();
    assert_eq!(errno_of(ns.setxattr(&c, f.fid, "user.a", b"2", true, false, None)), errno::EEXIST);
    assert_eq!(errno_of(ns.setxattr(&c, f.fid, "user.b", b"2", false, true, None)), errno::ENODATA);
    ns.setxattr(&c, f.fid, "user.a", b"3", false, true, None).unwrap();
    ns.setxattr(&c, f.fid, "trusted.t", b"t", false, false, None).unwrap();
    assert_eq!(ns.getxattr(&c, f.fid, "user.a").unwrap(), b"3");
    assert_eq!(ns.listxattr(&c, f.fid).unwrap(), vec!["trusted.t".to_string(), "user.a".to_string()]);
    let alice = Cred::user(1000, 100);
    assert_eq!(ns.listxattr(&alice, f.fid).unwrap(), vec!["user.a".to_string()]);
    assert_eq!(errno_of(ns.setxattr(&alice, f.fid, "user.a", b"x", false, false, None)), errno::EACCES);
    assert_eq!(errno_of(ns.getxattr(&alice, f.fid, "trusted.t")), errno::EPERM);
    assert_eq!(errno_of(ns.setxattr(&c, f.fid, "other.x", b"x", false, false, None)), errno::EOPNOTSUPP);
    assert_eq!(errno_of(ns.setxattr(&c, f.fid, "user.big", &vec![0; 65_537], false, false, None)), errno::E2BIG);
    // At most 64 KiB of xattrs per inode.
    ns.setxattr(&c, f.fid, "user.big", &vec![0; 65_000], false, false, None).unwrap();
    assert_eq!(errno_of(ns.setxattr(&c, f.fid, "user.more", &[0; 1000], false, false, None)), errno::ENOSPC);
    ns.removexattr(&c, f.fid, "user.big", None).unwrap();
    // User xattrs only on files and directories.
    let l2 = ns.symlink(&c, ROOT, "l3", b"x", None).unwrap();
    assert_eq!(errno_of(ns.setxattr(&c, l2.fid, "user.a", b"x", false, false, None)), errno::EPERM);
    ns.remove(&c, ROOT, "l3", false, None).unwrap();
    ns.removexattr(&c, f.fid, "user.a", None).unwrap();
    assert_eq!(errno_of(ns.removexattr(&c, f.fid, "user.a", None)), errno::ENODATA);
    assert_eq!(errno_of(ns.getxattr(&c, f.fid, "user.a")), errno::ENODATA);
    // Hard links: not to directories; the inode lives until its last name goes.
    assert_eq!(errno_of(ns.link(&c, ROOT, ROOT, "r", None)), errno::EPERM);
    ns.link(&c, f.fid, ROOT, "f2", None).unwrap();
    assert_eq!(errno_of(ns.link(&c, f.fid, ROOT, "f2", None)), errno::EEXIST);
    ns.remove(&c, ROOT, "f", false, None).unwrap();
    assert_eq!(ns.getattr(f.fid).unwrap().nlink, 1);
    ns.remove(&c, ROOT, "f2", false, None).unwrap();
    assert_eq!(errno_of(ns.getattr(f.fid)), errno::ENOENT);
    // Its xattrs went with it.
    assert_eq!(ns.statfs().unwrap().inodes, 2);
}

#[test]
fn special_files_keep_their_type_and_device_number_through_a_restart() {
    let (ns, v) = ns();
    let c = root();
    let dev = |major: u32, minor: u32| (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12);
    let fifo = ns.mknod(&c, ROOT, "fifo", mode::S_IFIFO | 0o640, 0, None).unwrap();
    let chr = ns.mknod(&c, ROOT, "chr", mode::S_IFCHR | 0o600, dev(1, 3), None).unwrap();
    let blk = ns.mknod(&c, ROOT, "blk", mode::S_IFBLK | 0o660, dev(259, 70_000), None).unwrap();
    let sock = ns.mknod(&c, ROOT, "sock", mode::S_IFSOCK | 0o755, 0, None).unwrap();
    assert_eq!((fifo.mode, fifo.rdev, fifo.size, fifo.nlink), (mode::S_IFIFO | 0o640, 0, 0, 1));
    assert_eq!((chr.mode, chr.rdev, chr.size), (mode::S_IFCHR | 0o600, dev(1, 3), 0));
    assert_eq!((blk.rdev, sock.mode, sock.rdev), (dev(259, 70_000), mode::S_IFSOCK | 0o755, 0));
    assert_eq!(ns.getattr(blk.fid).unwrap(), blk);
    // Bad requests: each a clear error, nothing made.
    let alice = Cred::user(1000, 100);
    assert_eq!(errno_of(ns.mknod(&alice, ROOT, "x", mode::S_IFCHR | 0o600, dev(1, 3), None)), errno::EPERM);
    assert_eq!(errno_of(ns.mknod(&c, ROOT, "x", mode::S_IFIFO | 0o600, 5, None)), errno::EINVAL);
    for kind in [mode::S_IFREG, mode::S_IFDIR, mode::S_IFLNK, 0] {
        assert_eq!(errno_of(ns.mknod(&c, ROOT, "x", kind | 0o600, 0, None)), errno::EINVAL, "{kind:o}");
    }
    assert_eq!(errno_of(ns.mknod(&c, ROOT, "fifo", mode::S_IFIFO | 0o600, 0, None)), errno::EEXIST);
    assert_eq!(errno_of(ns.lookup(&c, ROOT, "x")), errno::ENOENT);
    // Renamed, linked, chmod'ed, chown'ed like any inode.
    ns.rename(&c, ROOT, "fifo", ROOT, "fifo2", RenameMode::Replace, None).unwrap();
    ns.link(&c, chr.fid, ROOT, "chr2", None).unwrap();
    let s = SetAttr { mode: Some(0o700), uid: Some(7), ..SetAttr::default() };
    ns.setattr(&c, blk.fid, s, None).unwrap();
    let size = SetAttr { size: Some(10), ..SetAttr::default() };
    assert_eq!(errno_of(ns.setattr(&c, chr.fid, size, None)), errno::EINVAL, "devices have no size");
    let kinds = |ns: &Namespace| {
        list(ns, ROOT, 100).into_iter().map(|(n, a)| (n, a.mode, a.rdev, a.nlink, a.uid)).collect::<Vec<_>>()
    };
    let want = vec![
        ("blk".to_string(), mode::S_IFBLK | 0o700, dev(259, 70_000), 1, 7),
        ("chr".to_string(), mode::S_IFCHR | 0o600, dev(1, 3), 2, 0),
        ("chr2".to_string(), mode::S_IFCHR | 0o600, dev(1, 3), 2, 0),
        ("fifo2".to_string(), mode::S_IFIFO | 0o640, 0, 1, 0),
        ("sock".to_string(), mode::S_IFSOCK | 0o755, 0, 1, 0),
    ];
    assert_eq!(kinds(&ns), want);
    // From the log alone, then from the image.
    drop(ns);
    let ns = Namespace::open(v.clone(), NamespaceOptions::default()).unwrap();
    assert_eq!(kinds(&ns), want);
    ns.checkpoint().unwrap();
    drop(ns);
    let ns = Namespace::open(v, NamespaceOptions::default()).unwrap();
    assert_eq!(kinds(&ns), want);
    for n in ["blk", "chr", "chr2", "fifo2", "sock"] {
        ns.remove(&c, ROOT, n, false, None).unwrap();
    }
    assert_eq!(ns.statfs().unwrap().inodes, 1);
}

/// An ACL in its xattr form: (tag, perm, id) entries.
fn acl_bytes(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let entries = entries.iter().map(|&(tag, perm, id)| acl::Entry { tag, perm, id }).collect();
    acl::Acl { entries }.to_xattr()
}

#[test]
fn posix_acls_grant_inherit_follow_chmod_and_survive_a_restart() {
    use acl::{GROUP, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
    let (ns, v) = ns();
    let c = root();
    let (alice, bob) = (Cred::user(1000, 100), Cred::user(1001, 101));
    ns.setattr(&c, ROOT, SetAttr { mode: Some(0o777), ..SetAttr::default() }, None).unwrap();
    let f = ns.create(&alice, ROOT, "f", 0o600, None).unwrap();
    assert_eq!(errno_of(ns.open_file(1, &bob, f.fid, true, false)), errno::EACCES);
    // Bob may read and write by name, within the mask; the mode's group bits show the mask.
    let a = acl_bytes(&[(USER_OBJ, 6, 0), (USER, 6, 1001), (GROUP_OBJ, 0, 0), (MASK, 6, 0), (OTHER, 0, 0)]);
    assert_eq!(errno_of(ns.setxattr(&bob, f.fid, acl::ACCESS, &a, false, false, None)), errno::EPERM);
    ns.setxattr(&alice, f.fid, acl::ACCESS, &a, false, false, None).unwrap();
    assert_eq!(ns.getattr(f.fid).unwrap().mode, mode::S_IFREG | 0o660);
    assert!(ns.open_file(1, &bob, f.fid, true, true).is_ok());
    assert_eq!(errno_of(ns.open_file(1, &Cred::user(1002, 102), f.fid, true, false)), errno::EACCES);
    // A chmod sets the mask: write is gone for bob, and the ACL says so.
    ns.setattr(&alice, f.fid, SetAttr { mode: Some(0o640), ..SetAttr::default() }, None).unwrap();
    assert_eq!(errno_of(ns.open_file(1, &bob, f.fid, false, true)), errno::EACCES);
    let now = acl::Acl::from_xattr(&ns.getxattr(&bob, f.fid, acl::ACCESS).unwrap()).unwrap();
    assert_eq!(now.mode_bits(), 0o640);
    // An ACL the mode says all of is not kept.
    ns.setxattr(
        &alice,
        f.fid,
        acl::ACCESS,
        &acl_bytes(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 5, 0), (OTHER, 4, 0)]),
        false,
        false,
        None,
    )
    .unwrap();
    assert_eq!(errno_of(ns.getxattr(&c, f.fid, acl::ACCESS)), errno::ENODATA);
    assert_eq!(ns.getattr(f.fid).unwrap().mode, mode::S_IFREG | 0o754);
    // Bad ACLs: refused by name, nothing changed; no default ACL on a file.
    let e = ns.setxattr(&alice, f.fid, acl::ACCESS, &acl_bytes(&[(USER_OBJ, 7, 0), (OTHER, 0, 0)]), false, false, None);
    assert_eq!(errno_of(e), errno::EINVAL);
    let e = ns.setxattr(&alice, f.fid, acl::DEFAULT, &a, false, false, None);
    assert_eq!(errno_of(e), errno::EACCES);
    assert_eq!(ns.getattr(f.fid).unwrap().mode, mode::S_IFREG | 0o754);
    // A default ACL: new files and directories take it (limited by the mode asked for,
    // the umask playing no part), subdirectories keep it as theirs; elsewhere the umask.
    let d = ns.mkdir(&alice, ROOT, "d", 0o755, None).unwrap();
    let def = acl_bytes(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 5, 0), (GROUP, 7, 101), (MASK, 7, 0), (OTHER, 0, 0)]);
    ns.setxattr(&alice, d.fid, acl::DEFAULT, &def, false, false, None).unwrap();
    let masked = Cred { umask: 0o077, ..alice.clone() };
    let g = ns.create(&masked, d.fid, "g", 0o666, None).unwrap();
    assert_eq!(g.mode, mode::S_IFREG | 0o660, "owner rw, mask rw (group 101 rw), other none");
    assert!(ns.open_file(1, &bob, g.fid, true, true).is_ok(), "bob's group 101 is named");
    let sub = ns.mkdir(&masked, d.fid, "sub", 0o777, None).unwrap();
    assert_eq!(ns.getxattr(&c, sub.fid, acl::DEFAULT).unwrap(), def);
    assert_eq!(sub.mode & 0o777, 0o770);
    let plain = ns.create(&masked, ROOT, "plain", 0o666, None).unwrap();
    assert_eq!(plain.mode & 0o777, 0o600, "no default ACL: the umask");
    assert_eq!(errno_of(ns.getxattr(&c, plain.fid, acl::ACCESS)), errno::ENODATA);
    // All of it from the log, and from the image.
    let want = |ns: &Namespace| {
        let get = |fid| ns.getxattr(&c, fid, acl::ACCESS).ok();
        (get(g.fid), get(sub.fid), ns.getxattr(&c, d.fid, acl::DEFAULT).ok(), ns.getattr(g.fid).unwrap().mode)
    };
    let before = want(&ns);
    assert!(before.0.is_some() && before.1.is_some() && before.2.is_some());
    drop(ns);
    let ns = Namespace::open(v.clone(), NamespaceOptions::default()).unwrap();
    assert_eq!(want(&ns), before);
    ns.checkpoint().unwrap();
    drop(ns);
    let ns = Namespace::open(v, NamespaceOptions::default()).unwrap();
    assert_eq!(want(&ns), before);
}

#[test]
fn a_file_takes_links_up_to_link_max_then_emlink() {
    let (ns, _v) = ns();
    let c = root();
    let f = ns.create(&c, ROOT, "f", 0o644, None).unwrap();
    let d = ns.mkdir(&c, ROOT, "d", 0o755, None).unwrap();
    for i in 1..nacre_mdt::namespace::LINK_MAX {
        ns.link(&c, f.fid, d.fid, &i.to_string(), None).unwrap();
    }
    assert_eq!(ns.getattr(f.fid).unwrap().nlink, nacre_mdt::namespace::LINK_MAX);
    assert_eq!(errno_of(ns.link(&c, f.fid, d.fid, "one more", None)), errno::EMLINK);
    assert_eq!(errno_of(ns.lookup(&c, d.fid, "one more")), errno::ENOENT);
    ns.remove(&c, d.fid, "1", false, None).unwrap();
    ns.link(&c, f.fid, d.fid, "one more", None).unwrap();
}

#[test]
fn replayed_changes_answer_once() {
    let (ns, _v) = ns();
    let c = root();
    let k = |xid| Some(ReplyKey { client: 7, xid, acked_below: 0, digest: 0 });
    let a = ns.create(&c, ROOT, "f", 0o644, k(1)).unwrap();
    // The same xid again (a resend after a lost reply): the first answer, not EEXIST,
    // and no second inode.
    assert_eq!(ns.create(&c, ROOT, "f", 0o644, k(1)).unwrap(), a);
    assert_eq!(errno_of(ns.create(&c, ROOT, "f", 0o644, k(2))), errno::EEXIST);
    ns.remove(&c, ROOT, "f", false, k(3)).unwrap();
    ns.remove(&c, ROOT, "f", false, k(3)).unwrap();
    assert_eq!(ns.statfs().unwrap().inodes, 1);
    assert_eq!(ns.stats.replayed.load(std::sync::atomic::Ordering::Relaxed), 2);
    // Acknowledged replies are pruned: xid 1 runs again.
    ns.mkdir(&c, ROOT, "d", 0o755, Some(ReplyKey { client: 7, xid: 4, acked_below: 4, digest: 0 })).unwrap();
    assert_eq!(errno_of(ns.create(&c, ROOT, "d", 0o644, k(1))), errno::EEXIST);
}

#[test]
fn open_unlinked_files_live_until_the_last_close_and_restart_keeps_everything() {
    let (ns, v) = ns();
    let c = root();
    let f = ns.create(&c, ROOT, "f", 0o644, None).unwrap();
    let g = ns.create(&c, ROOT, "g", 0o644, None).unwrap();
    let d = ns.mkdir(&c, ROOT, "d", 0o755, None).unwrap();
    ns.create(&c, d.fid, "inner", 0o600, None).unwrap();
    let (h1, _) = ns.open_file(1, &c, f.fid, true, true).unwrap();
    let (h2, _) = ns.open_file(1, &c, f.fid, true, false).unwrap();
    assert_eq!(errno_of(ns.open_file(1, &c, d.fid, false, true)), errno::EISDIR);
    ns.remove(&c, ROOT, "f", false, None).unwrap();
    assert_eq!(ns.getattr(f.fid).unwrap().nlink, 0);
    // Closing without waiting: not the last handle, done; the last one must remove the
    // file (a change), so it is left to `close_file`, and nothing was done.
    assert!(matches!(ns.try_close_file(1, h1), Some(Ok(()))));
    assert!(ns.getattr(f.fid).is_ok(), "still open once");
    assert!(ns.try_close_file(1, h2).is_none());
    assert!(ns.getattr(f.fid).is_ok(), "the refused close did nothing");
    ns.close_file(1, h2).unwrap();
    assert_eq!(errno_of(ns.getattr(f.fid)), errno::ENOENT);
    assert_eq!(errno_of(ns.close_file(1, h2)), errno::EBADF);
    assert!(matches!(ns.try_close_file(1, h2), Some(Err(e)) if e.errno == errno::EBADF));
    assert!(matches!(ns.try_close_file(2, h1), Some(Err(e)) if e.errno == errno::EBADF), "not client 2's");
    // Opening without waiting gives what opening does; the last close of a linked file
    // needs no change.
    let (h3, a, _) = ns.open_reading(1, &c, g.fid, true, false, 0).unwrap();
    assert_eq!(a.fid, g.fid);
    assert_eq!(errno_of(ns.open_reading(1, &c, d.fid, false, true, 0)), errno::EISDIR);
    assert!(matches!(ns.try_close_file(1, h3), Some(Ok(()))));
    assert!(ns.getattr(g.fid).is_ok());
    // An orphan whose handle dies with the server goes at the next start.
    let (_h, _) = ns.open_file(1, &c, g.fid, true, false).unwrap();
    ns.remove(&c, ROOT, "g", false, None).unwrap();
    let before = list(&ns, ROOT, 100);
    drop(ns);
    let ns = Namespace::open(v, NamespaceOptions::default()).unwrap();
    assert_eq!(errno_of(ns.getattr(g.fid)), errno::ENOENT);
    assert_eq!(list(&ns, ROOT, 100), before);
    assert_eq!(ns.lookup(&c, d.fid, "inner").unwrap().mode, mode::S_IFREG | 0o600);
    // New FIDs never reuse old ones.
    let n = ns.create(&c, ROOT, "new", 0o644, None).unwrap();
    assert!(n.fid > d.fid && n.fid.mdt() == Some(0));
    assert_eq!(ns.statfs().unwrap().inodes, 4);
}

#[test]
fn concurrent_creates_share_commits() {
    let (ns, _v) = ns();
    let ns = Arc::new(ns);
    let threads = 8;
    let per = 200;
    std::thread::scope(|s| {
        for t in 0..threads {
            let ns = ns.clone();
            s.spawn(move || {
                let d = ns.mkdir(&root(), ROOT, &format!("t{t}"), 0o755, None).unwrap();
                for i in 0..per {
                    ns.create(&root(), d.fid, &format!("f{i}"), 0o644, None).unwrap();
                }
            });
        }
    });
    for t in 0..threads {
        let d = ns.lookup(&root(), ROOT, &format!("t{t}")).unwrap();
        assert_eq!(list(&ns, d.fid, 37).len(), per);
    }
    let commits = ns.stats.commits.load(std::sync::atomic::Ordering::Relaxed);
    let changes = ns.stats.changes.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(changes, (threads * (per + 1)) as u64);
    assert!(commits < changes, "{commits} commits for {changes} changes: no grouping");
}

#[test]
fn layouts_are_inherited_validated_and_survive_a_crash() {
    use nacre_proto::layout::{EOF, Kind};
    let (ns, v) = ns();
    let c = root();
    let lfs = |args: &str| Layout::from_lfs_args(&args.split_whitespace().collect::<Vec<_>>()).unwrap();
    // No default anywhere: one 1 MiB stripe.
    let f = ns.create(&c, ROOT, "plain", 0o644, None).unwrap();
    let l = ns.layout(f.fid).unwrap().unwrap();
    let Kind::Stripes(s) = &l.components[0].kind else { panic!("{l:?}") };
    assert_eq!((s.count, s.size, l.components[0].end), (1, 1 << 20, EOF));
    assert_eq!(ns.layout(ROOT).unwrap(), None);
    // The root's default is the file system's: its size fills what a directory leaves out.
    ns.set_dir_layout(&c, ROOT, Some(lfs("-c 2 -S 4M")), None).unwrap();
    let d = ns.mkdir(&c, ROOT, "d", 0o755, None).unwrap();
    ns.set_dir_layout(&c, d.fid, Some(lfs("-E 1M -L mdt -E eof -c -1")), None).unwrap();
    let pfl = ns.create(&c, d.fid, "pfl", 0o644, None).unwrap();
    let l = ns.layout(pfl.fid).unwrap().unwrap();
    assert_eq!(l.components.len(), 2);
    assert_eq!(l.components[0].kind, Kind::Mdt);
    let Kind::Stripes(s) = &l.components[1].kind else { panic!("{l:?}") };
    assert_eq!((s.count, s.size), (-1, 4 << 20), "count from the directory, size from the root");
    // A subdirectory takes its parent's default when it is made (as io500.sh counts on:
    // DoM set on mdtest-hard reaches the files of the directories mdtest makes in it).
    let sub = ns.mkdir(&c, d.fid, "sub", 0o755, None).unwrap();
    assert_eq!(ns.layout(sub.fid).unwrap(), ns.layout(d.fid).unwrap());
    let deep = ns.create(&c, sub.fid, "deep", 0o644, None).unwrap();
    assert_eq!(ns.layout(deep.fid).unwrap().unwrap().components[0].kind, Kind::Mdt);
    // A file in a directory without a default takes the root's.
    let e = ns.mkdir(&c, ROOT, "e", 0o755, None).unwrap();
    assert_eq!(ns.layout(e.fid).unwrap(), None, "the root's default is not copied: it applies everywhere anyway");
    let g = ns.create(&c, e.fid, "g", 0o644, None).unwrap();
    let Kind::Stripes(s) = &ns.layout(g.fid).unwrap().unwrap().components[0].kind.clone() else { panic!() };
    assert_eq!((s.count, s.size), (2, 4 << 20));
    // An explicit layout wins; a bad one is refused with the rule it breaks, and nothing
    // is made.
    let x = ns.create_with_layout(&c, e.fid, "x", 0o644, lfs("-c 8 -S 64K"), None).unwrap();
    let Kind::Stripes(s) = &ns.layout(x.fid).unwrap().unwrap().components[0].kind.clone() else { panic!() };
    assert_eq!((s.count, s.size), (8, 64 << 10));
    let mut bad = lfs("-c 2");
    if let Kind::Stripes(s) = &mut bad.components[0].kind {
        s.size = 100_000;
    }
    let err = ns.create_with_layout(&c, e.fid, "bad", 0o644, bad.clone(), None).unwrap_err();
    assert_eq!(err.errno, errno::EINVAL);
    assert!(err.message.contains("64 KiB"), "{}", err.message);
    assert_eq!(errno_of(ns.lookup(&c, e.fid, "bad")), errno::ENOENT);
    assert_eq!(errno_of(ns.set_dir_layout(&c, e.fid, Some(bad), None)), errno::EINVAL);
    // Only directories take a default, and only from their owner.
    assert_eq!(errno_of(ns.set_dir_layout(&c, g.fid, Some(lfs("-c 1")), None)), errno::ENOTDIR);
    assert_eq!(errno_of(ns.set_dir_layout(&Cred::user(5, 5), e.fid, None, None)), errno::EPERM);
    // The layout reads as the lustre.lov xattr.
    assert_eq!(
        Layout::decode(&ns.getxattr(&c, x.fid, "lustre.lov").unwrap()).unwrap(),
        ns.layout(x.fid).unwrap().unwrap()
    );
    // Removing the directory default: new files take the root's again.
    ns.set_dir_layout(&c, d.fid, None, None).unwrap();
    let h = ns.create(&c, d.fid, "h", 0o644, None).unwrap();
    assert_eq!(ns.layout(h.fid).unwrap().unwrap().components.len(), 1);
    // Through a crash, from the redo log.
    let want = ns.layout(pfl.fid).unwrap();
    ns.crash();
    let ns = Namespace::open(v, NamespaceOptions::default()).unwrap();
    assert_eq!(ns.layout(pfl.fid).unwrap(), want);
    assert!(ns.layout(ROOT).unwrap().is_some());
    // A file's layout goes with it.
    ns.remove(&c, d.fid, "pfl", false, None).unwrap();
    assert_eq!(errno_of(ns.layout(pfl.fid)), errno::ENOENT);
}

/// An open by name is a lookup and an open in one call; opened for reading, a small file
/// whose bytes are all on the MDT comes with them (DoM read-on-open), and no other does.
#[test]
fn open_by_name_brings_a_small_dom_file_with_it() {
    use nacre_mdt::OpenAnswer;
    use nacre_proto::layout::Layout;
    let (ns, _v) = ns();
    let c = root();
    let lfs = |args: &str| Layout::from_lfs_args(&args.split_whitespace().collect::<Vec<_>>()).unwrap();
    let f = ns.create_with_layout(&c, ROOT, "small", 0o644, lfs("-E 64K -L mdt -E eof -c 1"), None).unwrap();
    let body: Vec<u8> = (0..3901u32).map(|i| (i * 13 % 251) as u8).collect();
    ns.write_dom(&c, f.fid, 0, &body, false, None).unwrap();
    let open = |name: &str, read: bool, write: bool, dom_read: u32| match ns
        .open_at(7, &c, ROOT, name, read, write, dom_read)
    {
        Ok(OpenAnswer::Here((h, a, data))) => {
            ns.close_file(7, h).unwrap();
            Ok((a, data))
        }
        Ok(OpenAnswer::Elsewhere(a)) => panic!("{name} is here, not at {}", a.fid),
        Err(e) => Err(e),
    };
    let (a, data) = open("small", true, false, 64 << 10).unwrap();
    assert_eq!((a.fid, a.size), (f.fid, 3901));
    assert_eq!(data, body);
    // Not asked, not for reading, or larger than asked: the open alone.
    assert!(open("small", true, false, 0).unwrap().1.is_empty());
    assert!(open("small", false, true, 64 << 10).unwrap().1.is_empty());
    assert!(open("small", true, true, 3900).unwrap().1.is_empty());
    assert_eq!(open("small", true, true, 3901).unwrap().1, body);
    // Bytes past the DoM component live on an OST: not sent.
    ns.write_dom(&c, f.fid, (64 << 10) - 4, b"full", false, None).unwrap();
    ns.setattr(&c, f.fid, SetAttr { size: Some(70_000), ..Default::default() }, None).unwrap();
    assert!(open("small", true, false, 1 << 20).unwrap().1.is_empty());
    // A file with no DoM, and the errors of a lookup and of an open.
    ns.create(&c, ROOT, "plain", 0o644, None).unwrap();
    assert!(open("plain", true, false, 64 << 10).unwrap().1.is_empty());
    assert_eq!(errno_of(open("absent", true, false, 0)), errno::ENOENT);
    ns.create(&c, ROOT, "private", 0o600, None).unwrap();
    assert_eq!(errno_of(ns.open_at(8, &Cred::user(5, 5), ROOT, "private", true, false, 0).map(|_| ())), errno::EACCES);
}

#[test]
fn data_on_the_mdt_reads_back_and_follows_truncates_and_crashes() {
    use nacre_proto::layout::Layout;
    let (ns, v) = ns();
    let c = root();
    let lfs = |args: &str| Layout::from_lfs_args(&args.split_whitespace().collect::<Vec<_>>()).unwrap();
    let f = ns.create_with_layout(&c, ROOT, "small", 0o644, lfs("-E 1M -L mdt -E eof -c 1"), None).unwrap();
    let body: Vec<u8> = (0..3901u32).map(|i| (i * 7 % 251) as u8).collect();
    let a = ns.write_dom(&c, f.fid, 0, &body, false, None).unwrap();
    assert_eq!(a.size, 3901);
    assert_eq!(ns.read_dom(&c, f.fid, 0, 1 << 20).unwrap(), body, "a read stops at the end of the file");
    // A write into the second block leaves a hole of zeros.
    ns.write_dom(&c, f.fid, 70_000, b"tail", false, None).unwrap();
    let all = ns.read_dom(&c, f.fid, 0, 1 << 20).unwrap();
    assert_eq!(all.len(), 70_004);
    assert_eq!(&all[..3901], &body[..]);
    assert!(all[3901..70_000].iter().all(|&b| b == 0));
    assert_eq!(&all[70_000..], b"tail");
    // Past the DoM component: EFBIG; a file without DoM: EINVAL; nobody else writes.
    assert_eq!(errno_of(ns.write_dom(&c, f.fid, (1 << 20) - 2, b"xyz", false, None)), errno::EFBIG);
    let g = ns.create(&c, ROOT, "plain", 0o644, None).unwrap();
    assert_eq!(errno_of(ns.write_dom(&c, g.fid, 0, b"x", false, None)), errno::EINVAL);
    assert_eq!(errno_of(ns.write_dom(&Cred::user(5, 5), f.fid, 0, b"x", false, None)), errno::EACCES);
    // A directory with a DoM default keeps no data itself.
    let d = ns.mkdir(&c, ROOT, "domdir", 0o755, None).unwrap();
    ns.set_dir_layout(&c, d.fid, Some(lfs("-E 1M -L mdt -E eof -c 1")), None).unwrap();
    assert_eq!(errno_of(ns.write_dom(&c, d.fid, 0, b"x", false, None)), errno::EISDIR);
    assert_eq!(errno_of(ns.read_dom(&c, d.fid, 0, 1)), errno::EISDIR);
    // Truncate down cuts the data; growing again reads zeros, not the old bytes.
    ns.setattr(&c, f.fid, SetAttr { size: Some(100), ..Default::default() }, None).unwrap();
    ns.setattr(&c, f.fid, SetAttr { size: Some(80_000), ..Default::default() }, None).unwrap();
    let back = ns.read_dom(&c, f.fid, 0, 1 << 20).unwrap();
    assert_eq!(back.len(), 80_000);
    assert_eq!(&back[..100], &body[..100]);
    assert!(back[100..].iter().all(|&b| b == 0), "truncated bytes came back");
    // Through a crash.
    ns.crash();
    let ns = Namespace::open(v, NamespaceOptions::default()).unwrap();
    assert_eq!(ns.read_dom(&c, f.fid, 0, 1 << 20).unwrap(), back);
    ns.remove(&c, ROOT, "small", false, None).unwrap();
    assert_eq!(errno_of(ns.read_dom(&c, f.fid, 0, 10)), errno::ENOENT);
}

#[test]
fn pools_are_checked_and_place_objects_on_their_osts() {
    let (ns, _v) = ns();
    let c = root();
    ns.attach_osts(&[0, 1, 2]).unwrap();
    for ost in 0..3 {
        ns.add_precreated(ost, 100, 50).unwrap();
    }
    let lfs = |a: &str| Layout::from_lfs_args(&a.split_whitespace().collect::<Vec<_>>()).unwrap();
    // No pools heard from the MGS yet: a layout naming one is refused, naming why.
    let e = ns.create_with_layout(&c, Fid::ROOT, "early", 0o644, lfs("-c 2 -p fast"), None).unwrap_err();
    assert!(e.errno == errno::EINVAL && e.message.contains("from the MGS"), "{e:?}");
    ns.set_ost_pools(BTreeMap::from([("fast".to_string(), vec![1, 2]), ("gone".to_string(), vec![7])]));
    let e = ns.create_with_layout(&c, Fid::ROOT, "f", 0o644, lfs("-c 2 -p nope"), None).unwrap_err();
    assert!(e.errno == errno::EINVAL && e.message.contains("not defined"), "{e:?}");
    let e = ns.set_dir_layout(&c, Fid::ROOT, Some(lfs("-c 1 -p nope")), None).unwrap_err();
    assert_eq!(e.errno, errno::EINVAL);
    // A pool whose OSTs have no objects here: ENOSPC, nothing made.
    let e = ns.create_with_layout(&c, Fid::ROOT, "g", 0o644, lfs("-c 1 -p gone"), None).unwrap_err();
    assert_eq!(e.errno, errno::ENOSPC, "{e:?}");
    assert_eq!(errno_of(ns.lookup(&c, Fid::ROOT, "g")), errno::ENOENT);
    // Every file of pool `fast` has its objects on OSTs 1 and 2 only, even with -c -1.
    for (i, l) in ["-c 2 -p fast", "-c -1 -p fast", "-c 1 -p fast"].into_iter().enumerate() {
        let a = ns.create_with_layout(&c, Fid::ROOT, &format!("p{i}"), 0o644, lfs(l), None).unwrap();
        let osts: Vec<u32> = ns.objects(a.fid).unwrap().into_iter().flatten().map(|(o, _)| o).collect();
        assert!(!osts.is_empty() && osts.iter().all(|o| [1, 2].contains(o)), "{l}: {osts:?}");
        assert_eq!(osts.len(), [2, 2, 1][i], "{l}");
    }
    // Inherited from a directory default too.
    ns.set_dir_layout(&c, Fid::ROOT, Some(lfs("-c 1 -p fast")), None).unwrap();
    for i in 0..4 {
        let a = ns.create(&c, Fid::ROOT, &format!("q{i}"), 0o644, None).unwrap();
        let osts: Vec<u32> = ns.objects(a.fid).unwrap().into_iter().flatten().map(|(o, _)| o).collect();
        assert!(osts.len() == 1 && osts[0] != 0, "{osts:?}");
    }
}

#[test]
fn a_full_mdt_refuses_growth_with_enospc_and_removals_still_work() {
    let (ns, _v) = ns();
    let c = root();
    let lfs = |a: &str| Layout::from_lfs_args(&a.split_whitespace().collect::<Vec<_>>()).unwrap();
    ns.set_dir_layout(&c, Fid::ROOT, Some(lfs("-E 1M -L mdt")), None).unwrap();
    let body = vec![0x33u8; 1 << 20];
    let mut made = 0;
    let err = loop {
        let name = format!("f{made}");
        let f = match ns.create(&c, Fid::ROOT, &name, 0o644, None) {
            Ok(f) => f,
            Err(e) => break e,
        };
        made += 1;
        if let Err(e) = ns.write_dom(&c, f.fid, 0, &body, false, None) {
            break e;
        }
        assert!(made < 10_000, "never full");
    };
    // Refused with ENOSPC, naming the fill; never a poisoned database.
    assert_eq!(err.errno, errno::ENOSPC, "{err:?}");
    assert!(err.message.contains("fills"), "{err:?}");
    // What is there reads back, removals work, and so does a create afterwards.
    assert_eq!(ns.read_dom(&c, ns.lookup(&c, Fid::ROOT, "f0").unwrap().fid, 0, 16).unwrap(), vec![0x33u8; 16]);
    for i in 0..made {
        ns.remove(&c, Fid::ROOT, &format!("f{i}"), false, None).unwrap();
    }
    // Once a checkpoint has let redb give its freed tail back, files can be made again.
    let started = std::time::Instant::now();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(250));
        ns.setattr(&c, Fid::ROOT, SetAttr { mtime_ns: Some(None), ..SetAttr::default() }, None).unwrap();
        match ns.create(&c, Fid::ROOT, "after", 0o644, None) {
            Ok(_) => break,
            Err(e) => assert!(started.elapsed().as_secs() < 5, "still refused after the removals: {e:?}"),
        }
    }
}

#[test]
fn a_small_file_is_made_with_its_data_in_one_change() {
    let (ns, _v) = ns();
    let c = root();
    let lfs = |a: &str| Layout::from_lfs_args(&a.split_whitespace().collect::<Vec<_>>()).unwrap();
    let plain = ns.mkdir(&c, Fid::ROOT, "plain", 0o755, None).unwrap();
    let dom = ns.mkdir(&c, Fid::ROOT, "dom", 0o755, None).unwrap();
    ns.set_dir_layout(&c, dom.fid, Some(lfs("-E 64K -L mdt -E eof -c 1")), None).unwrap();
    let body: Vec<u8> = (0..3901u32).map(|i| (i % 253) as u8).collect();
    let commits = ns.stats.commits.load(std::sync::atomic::Ordering::Relaxed);
    let a = ns.create_with_data(&c, dom.fid, "small", 0o600, &body, None).unwrap();
    assert_eq!(ns.stats.commits.load(std::sync::atomic::Ordering::Relaxed), commits + 1, "one change");
    assert_eq!((a.size, a.mode), (3901, mode::S_IFREG | 0o600));
    assert_eq!(ns.read_dom(&c, a.fid, 0, 8192).unwrap(), body);
    // A mode without write permission still takes the data its creator sends (as an
    // open with O_CREAT of mode 0444 may write).
    let u = Cred::user(1000, 1000);
    ns.setattr(&c, dom.fid, SetAttr { mode: Some(0o777), ..SetAttr::default() }, None).unwrap();
    let ro = ns.create_with_data(&u, dom.fid, "ro", 0o444, b"mine", None).unwrap();
    assert_eq!((ro.uid, ro.size), (1000, 4));
    assert_eq!(ns.read_dom(&u, ro.fid, 0, 16).unwrap(), b"mine");
    // No DoM component, or data past it: refused, nothing made.
    let e = ns.create_with_data(&c, plain.fid, "f", 0o644, &body, None).unwrap_err();
    assert!(e.errno == errno::EINVAL && e.message.contains("no DoM"), "{e:?}");
    assert_eq!(errno_of(ns.lookup(&c, plain.fid, "f")), errno::ENOENT);
    let big = vec![1u8; (64 << 10) + 1];
    assert_eq!(errno_of(ns.create_with_data(&c, dom.fid, "big", 0o644, &big, None)), errno::EFBIG);
    assert_eq!(errno_of(ns.lookup(&c, dom.fid, "big")), errno::ENOENT);
    assert_eq!(errno_of(ns.create_with_data(&c, dom.fid, "small", 0o644, b"y", None)), errno::EEXIST);
    assert_eq!(ns.read_dom(&c, a.fid, 0, 8192).unwrap(), body, "unchanged by the refused create");
}

/// A nearly full MDT keeps no more new files' first bytes: past the DoM threshold a new
/// file's layout starts on the OSTs, as Lustre's `dom_threshold_free_mb` does, and the
/// files already there keep theirs.
#[test]
fn a_nearly_full_mdt_gives_new_files_no_dom_component() {
    let ns = Namespace::format(volume_of(2, 64 << 20, Level::Raid1), 0, NamespaceOptions::default()).unwrap();
    let c = root();
    let lfs = |a: &str| Layout::from_lfs_args(&a.split_whitespace().collect::<Vec<_>>()).unwrap();
    let dom = ns.mkdir(&c, Fid::ROOT, "dom", 0o755, None).unwrap();
    ns.set_dir_layout(&c, dom.fid, Some(lfs("-E 64K -L mdt -E eof -c 1")), None).unwrap();
    let first = ns.create(&c, dom.fid, "first", 0o644, None).unwrap();
    let starts_on_mdt =
        |fid: Fid| ns.layout(fid).unwrap().unwrap().components[0].kind == nacre_proto::layout::Kind::Mdt;
    assert!(ns.has_room_for_dom() && starts_on_mdt(first.fid));
    let body = vec![7u8; 60 << 10];
    let mut made = 0;
    while ns.has_room_for_dom() {
        assert!(made < 1000, "the MDT never filled");
        match ns.create_with_data(&c, dom.fid, &format!("f{made}"), 0o644, &body, None) {
            Ok(_) => made += 1,
            // A checkpoint grew the image between the check and the create: full now.
            Err(e) if e.errno == errno::EINVAL && e.message.contains("no DoM") => break,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(made > 0);
    let late = ns.create(&c, dom.fid, "late", 0o644, None).unwrap();
    let l = ns.layout(late.fid).unwrap().unwrap();
    assert!(!starts_on_mdt(late.fid), "{l:?}");
    assert_eq!((l.components.len(), l.components[0].start), (1, 0), "the striped component from byte 0");
    assert!(starts_on_mdt(first.fid), "files made before keep their DoM component");
    assert_eq!(ns.read_dom(&c, ns.lookup(&c, dom.fid, "f0").unwrap().fid, 0, 16).unwrap(), vec![7u8; 16]);
    let e = ns.create_with_data(&c, dom.fid, "more", 0o644, b"x", None).unwrap_err();
    assert!(e.errno == errno::EINVAL && e.message.contains("no DoM"), "{e:?}");
}

/// After a restart a replayed create takes back exactly the objects its first answer
/// named (the client may have written them), and those given before them, to creates
/// lost and not replayed, go to the destroy log; one naming an object another file has
/// fails with EEXIST and changes nothing. New files take only objects precreated since
/// the restart, and once replays end the rest from before it are destroyed.
#[test]
fn replayed_creates_claim_their_objects_and_never_share_one() {
    let (ns, _v) = ns();
    let ns = Arc::new(ns);
    let c = root();
    ns.attach_osts(&[0]).unwrap();
    ns.add_precreated(0, 100, 10).unwrap();
    let one = Layout::from_lfs_args(&["-c", "1"]).unwrap();
    let kept = ns.create_with_layout(&c, ROOT, "kept", 0o644, one.clone(), None).unwrap();
    assert_eq!(ns.objects(kept.fid).unwrap(), vec![vec![(0, 100)]]);

    ns.expect_replays();
    assert_eq!(ns.pool_levels(), vec![(0, 0)], "objects from before the restart wait for replays");
    let e = ns.create_with_layout(&c, ROOT, "early", 0o644, one.clone(), None).unwrap_err();
    assert_eq!(e.errno, errno::ENOSPC, "{e:?}");
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let replay = |name: &str, oid: u32, objects: Vec<Vec<(u32, u64)>>| {
        let first = FirstAnswer { fid: Fid { oid, ..kept.fid }, layout: one.encode(), objects };
        let change = Namespace::create_with_layout_change(&c, ROOT, name, 0o644, one.clone());
        rt.block_on(ns.submit(None, Namespace::replaying(first, change), 0))
    };
    // Object 100 is file "kept"'s: a replay naming it is refused, and makes nothing.
    let e = replay("twin", kept.fid.oid + 100, vec![vec![(0, 100)]]).unwrap_err();
    assert!(e.errno == errno::EEXIST && e.message.contains("object 100 of OST 0"), "{e:?}");
    assert_eq!(errno_of(ns.lookup(&c, ROOT, "twin")), errno::ENOENT);
    // Two lost creates were given 101 and 102; only the second is replayed.
    replay("second", kept.fid.oid + 2, vec![vec![(0, 102)]]).unwrap();
    let second = ns.lookup(&c, ROOT, "second").unwrap();
    assert_eq!(second.fid.oid, kept.fid.oid + 2, "the replay keeps its FID");
    assert_eq!(ns.objects(second.fid).unwrap(), vec![vec![(0, 102)]], "and its objects");
    assert_eq!(ns.pending_destroys(Some(0), 100).unwrap(), vec![(0, 101)], "the unreplayed create's object");
    let e = replay("again", kept.fid.oid + 3, vec![vec![(0, 102)]]).unwrap_err();
    assert_eq!(e.errno, errno::EEXIST, "{e:?}");

    // Objects precreated since the restart go to new files, even while replays run.
    ns.add_precreated(0, 110, 10).unwrap();
    let new = ns.create_with_layout(&c, ROOT, "new", 0o644, one.clone(), None).unwrap();
    assert_eq!(ns.objects(new.fid).unwrap(), vec![vec![(0, 110)]]);
    assert!(!ns.has_stale(0), "kept while replays may come");
    ns.end_replays();
    assert!(ns.has_stale(0));
    assert!(!ns.retire_stale(0).unwrap());
    assert!(!ns.has_stale(0));
    let destroyed: Vec<u64> = ns.pending_destroys(Some(0), 100).unwrap().into_iter().map(|(_, o)| o).collect();
    assert_eq!(destroyed, [101, 103, 104, 105, 106, 107, 108, 109]);
    assert_eq!(ns.pool_levels(), vec![(0, 9)]);
    let e = replay("late", kept.fid.oid + 4, vec![vec![(0, 111)]]).unwrap_err();
    assert!(e.message.contains("after replays ended"), "{e:?}");
}

/// Objects a restart lost the record of (their precreate's answer was recorded by a lost
/// change) are still claimed by the replays that name them: past the high-water mark, or
/// in the gap below the first batch precreated after the restart. A replay that fails on
/// its second object gives back its first.
#[test]
fn replays_claim_objects_whose_precreate_record_was_lost_and_a_failed_one_takes_nothing() {
    let (ns, _v) = ns();
    let ns = Arc::new(ns);
    let c = root();
    ns.attach_osts(&[0, 1]).unwrap();
    ns.add_precreated(0, 100, 10).unwrap();
    ns.add_precreated(1, 100, 10).unwrap();
    ns.expect_replays();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let two = Layout::from_lfs_args(&["-c", "2"]).unwrap();
    let mut next_oid = 1000;
    let mut replay = |name: &str, objects: Vec<Vec<(u32, u64)>>| {
        next_oid += 1;
        let first = FirstAnswer { fid: Fid { seq: 0x200000400, oid: next_oid, ver: 0 }, layout: two.encode(), objects };
        let change = Namespace::create_with_layout_change(&c, ROOT, name, 0o644, two.clone());
        rt.block_on(ns.submit(None, Namespace::replaying(first, change), 0))
    };
    // A first answer is the client's word: one naming an object far past what the MDT
    // made is refused, and destroys nothing.
    let e = replay("far", vec![vec![(0, u64::MAX), (1, 100)]]).unwrap_err();
    assert!(e.errno == errno::EINVAL && e.message.contains("far past"), "{e:?}");
    let e = replay("odd", vec![vec![(0, 100), (1, 100)], vec![]]).unwrap_err();
    assert!(e.errno == errno::EINVAL && e.message.contains("1 components, objects for 2"), "{e:?}");
    // OST 0's object 100 is free, OST 1's 99 is below its pool: the replay fails whole,
    // and 100 stays in the pool (the claim below passes it, so it is destroyed there).
    let e = replay("half", vec![vec![(0, 100), (1, 99)]]).unwrap_err();
    assert_eq!(e.errno, errno::EEXIST, "{e:?}");
    assert!(ns.pending_destroys(None, 100).unwrap().is_empty(), "a failed replay destroys nothing");
    // Past OST 0's mark (110): objects 110..112 were made by a precreate whose record was
    // lost; 112 is claimed, and every object before it goes.
    replay("past", vec![vec![(0, 112), (1, 100)]]).unwrap();
    let past = ns.lookup(&c, ROOT, "past").unwrap();
    assert_eq!(ns.objects(past.fid).unwrap(), vec![vec![(0, 112), (1, 100)]]);
    let gone: Vec<(u32, u64)> = ns.pending_destroys(Some(0), 100).unwrap();
    assert_eq!(gone, (100..112).map(|o| (0, o)).collect::<Vec<_>>());
    // A batch precreated on OST 1 during replays leaves a gap (110..120) of objects made
    // before the restart: a replay may claim one, a new file may not.
    ns.add_precreated(1, 120, 10).unwrap();
    replay("gap", vec![vec![(0, 113), (1, 115)]]).unwrap();
    let gap = ns.lookup(&c, ROOT, "gap").unwrap();
    assert_eq!(ns.objects(gap.fid).unwrap(), vec![vec![(0, 113), (1, 115)]]);
    ns.add_precreated(0, 130, 10).unwrap();
    let new = ns.create_with_layout(&c, ROOT, "new", 0o644, two.clone(), None).unwrap();
    let objects = ns.objects(new.fid).unwrap();
    assert!(objects[0].iter().all(|&(ost, o)| o >= if ost == 0 { 130 } else { 120 }), "{objects:?}");
}
