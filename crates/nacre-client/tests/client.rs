//! The client library against a whole file system in memory: striped, PFL and DoM files
//! read back exactly as written (sparse parts as zeros), sizes from objects while open,
//! two mounts sharing a file, truncates, metadata operations and their errors, striped
//! directories over two MDTs, and the tunables.

mod common;

use std::sync::Arc;

use common::{TestFs, pattern};
use nacre_client::error::errno;
use nacre_client::{Creds, Fid, FileSystem, OpenFlags, SetAttr};
use nacre_proto::layout::Layout;
use nacre_proto::mdt::set;

fn lfs(a: &str) -> Layout {
    Layout::from_lfs_args(&a.split_whitespace().collect::<Vec<_>>()).unwrap()
}

/// Write `data` at `offset` in calls of the sizes in `chunks` (cycled).
async fn write_in(f: &nacre_client::File, offset: u64, data: &[u8], chunks: &[usize]) {
    let mut at = 0;
    for &n in chunks.iter().cycle() {
        if at == data.len() {
            break;
        }
        let n = n.min(data.len() - at);
        assert_eq!(f.write(offset + at as u64, &data[at..at + n]).await.unwrap(), n);
        at += n;
    }
}

async fn read_all(fs: &FileSystem, fid: Fid, chunk: usize) -> Vec<u8> {
    let f = fs.open(&Creds::default(), fid, OpenFlags::READ).await.unwrap();
    let mut out = Vec::new();
    loop {
        let b = f.read(out.len() as u64, chunk).await.unwrap();
        if b.is_empty() {
            break;
        }
        out.extend_from_slice(&b);
    }
    f.close().await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_of_every_layout_read_back_what_was_written() {
    let t = TestFs::start(1, 3).await;
    let fs = t.mount("c1").await;
    let c = Creds::default();
    for (name, layout) in [
        ("plain", None),
        ("wide", Some("-c 3 -S 64K")),
        ("over", Some("-C 5 -S 64K")),
        ("pfl", Some("-E 128K -L mdt -E 1M -c 2 -S 64K -E -1 -c 3 -S 128K")),
    ] {
        let l = layout.map(lfs);
        let a = fs.create(&c, Fid::ROOT, name, 0o644, l.as_ref()).await.unwrap();
        let f = fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
        let data = pattern(a.fid.oid as u64, 3 << 20);
        write_in(&f, 0, &data, &[1000, 70_000, 300_000, 4096, 1 << 20]).await;
        // A sparse tail: a hole from 3 MiB to 5 MiB.
        let tail = pattern(7, 12_345);
        f.write(5 << 20, &tail).await.unwrap();
        let size = (5 << 20) + tail.len() as u64;
        assert_eq!(f.size_hint(), size);
        f.close().await.unwrap();
        assert_eq!(fs.getattr(&c, a.fid).await.unwrap().size, size, "{name}: size at the MDT after close");
        let mut want = data.clone();
        want.resize(5 << 20, 0);
        want.extend_from_slice(&tail);
        for chunk in [100_000, 1 << 20, 4096 * 3 + 7] {
            let got = read_all(&fs, a.fid, chunk).await;
            assert!(got == want, "{name}: read in {chunk}-byte calls differs (len {} vs {})", got.len(), want.len());
        }
        // Random reads, out of order, straddling stripes and the hole.
        let f = fs.open(&c, a.fid, OpenFlags::READ).await.unwrap();
        for (off, len) in [(5 << 20, 20_000), (65_530, 20), (1_000_000, 400_000), (3 << 20, 10), (0, 1)] {
            let got = f.read(off, len).await.unwrap();
            let end = (off as usize + len).min(want.len());
            assert_eq!(got, &want[off as usize..end], "{name}: read of {len} at {off}");
        }
        f.close().await.unwrap();
        let l = fs.getlayout(&c, a.fid).await.unwrap().unwrap();
        match name {
            "wide" => assert_eq!(l.objects[0].len(), 3),
            "over" => assert_eq!(l.objects[0].len(), 5, "overstriping: 5 objects on 3 OSTs"),
            "pfl" => assert_eq!(l.objects.iter().map(Vec::len).collect::<Vec<_>>(), vec![0, 2, 3]),
            _ => {}
        }
    }
    fs.unmount().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_come_from_the_objects_while_open_and_from_the_mdt_after_close() {
    let t = TestFs::start(1, 2).await;
    let (a_fs, b_fs) = (t.mount("a").await, t.mount("b").await);
    let c = Creds::default();
    let a = a_fs.create(&c, Fid::ROOT, "grow", 0o644, Some(&lfs("-c 2 -S 64K"))).await.unwrap();
    let f = a_fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    f.write(0, &pattern(1, 200_000)).await.unwrap();
    f.fsync().await.unwrap();
    assert_eq!(a_fs.getattr(&c, a.fid).await.unwrap().size, 200_000, "the writer glimpses");
    // fsync published the size; a write after it is seen by the writer at once.
    f.write(500_000, b"x").await.unwrap();
    f.fsync().await.unwrap();
    assert_eq!(a_fs.getattr(&c, a.fid).await.unwrap().size, 500_001);
    // What was written back but not yet published reaches another mount too: the MDT
    // says the file is open for writing, and the other mount glimpses.
    f.write(700_000, b"yz").await.unwrap();
    f.write_back().await.unwrap();
    assert_eq!(b_fs.getattr(&c, a.fid).await.unwrap().size, 700_002, "glimpsed by another mount");
    assert_eq!(b_fs.lookup(&c, Fid::ROOT, "grow").await.unwrap().size, 700_002, "lookup too");
    f.close().await.unwrap();
    let got = b_fs.getattr(&c, a.fid).await.unwrap();
    assert_eq!(got.size, 700_002, "another mount sees the size after close");
    let data = read_all(&b_fs, a.fid, 1 << 20).await;
    assert_eq!(&data[..200_000], &pattern(1, 200_000)[..]);
    assert!(data[200_000..500_000].iter().all(|&b| b == 0));
    assert_eq!(data[500_000], b'x');
    assert_eq!(&data[700_000..], b"yz");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_mounts_writing_disjoint_ranges_of_one_file_both_land() {
    let t = TestFs::start(1, 3).await;
    let (a_fs, b_fs) = (t.mount("a").await, t.mount("b").await);
    let c = Creds::default();
    let a = a_fs.create(&c, Fid::ROOT, "shared", 0o666, Some(&lfs("-c 3 -S 64K"))).await.unwrap();
    let fa = a_fs.open(&c, a.fid, OpenFlags::READ_WRITE).await.unwrap();
    let fb = b_fs.open(&c, a.fid, OpenFlags::READ_WRITE).await.unwrap();
    // Interleaved, unaligned ranges: A has the even 100,000-byte blocks, B the odd.
    let block = 100_000usize;
    let whole = pattern(3, block * 20);
    let (wa, wb) = tokio::join!(
        async {
            for i in (0..20).step_by(2) {
                fa.write((i * block) as u64, &whole[i * block..(i + 1) * block]).await.unwrap();
            }
            fa.fsync().await.unwrap();
        },
        async {
            for i in (1..20).step_by(2) {
                fb.write((i * block) as u64, &whole[i * block..(i + 1) * block]).await.unwrap();
            }
            fb.fsync().await.unwrap();
        }
    );
    let _ = (wa, wb);
    // Each reads the other's bytes.
    assert_eq!(fa.read(block as u64, block).await.unwrap(), &whole[block..2 * block]);
    assert_eq!(fb.read(0, block).await.unwrap(), &whole[..block]);
    fa.close().await.unwrap();
    fb.close().await.unwrap();
    assert!(read_all(&a_fs, a.fid, 333_333).await == whole);
    assert!(read_all(&b_fs, a.fid, 1 << 20).await == whole);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_cuts_objects_and_extends_with_zeros() {
    let t = TestFs::start(1, 2).await;
    let fs = t.mount("c").await;
    let c = Creds::default();
    for (name, layout) in [("striped", "-c 2 -S 64K"), ("dom", "-E 64K -L mdt -E -1 -c 2 -S 64K")] {
        let a = fs.create(&c, Fid::ROOT, name, 0o644, Some(&lfs(layout))).await.unwrap();
        let data = pattern(9, 1 << 20);
        let f = fs.open(&c, a.fid, OpenFlags::READ_WRITE).await.unwrap();
        f.write(0, &data).await.unwrap();
        f.set_len(100_000).await.unwrap();
        assert_eq!(fs.getattr(&c, a.fid).await.unwrap().size, 100_000, "{name}");
        f.set_len(300_000).await.unwrap();
        let got = f.read(0, 1 << 20).await.unwrap();
        assert_eq!(got.len(), 300_000, "{name}");
        assert_eq!(&got[..100_000], &data[..100_000], "{name}");
        assert!(got[100_000..].iter().all(|&b| b == 0), "{name}: the cut bytes came back");
        f.close().await.unwrap();
        // O_TRUNC empties it; the objects too.
        let f = fs.open(&c, a.fid, OpenFlags { truncate: true, ..OpenFlags::WRITE }).await.unwrap();
        f.close().await.unwrap();
        assert_eq!(fs.getattr(&c, a.fid).await.unwrap().size, 0);
        assert!(read_all(&fs, a.fid, 4096).await.is_empty());
        // Truncate through setattr, on a closed file.
        let f = fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
        f.write(0, &data).await.unwrap();
        f.close().await.unwrap();
        fs.setattr(&c, a.fid, SetAttr { mask: set::SIZE, size: 70_000, ..SetAttr::default() }).await.unwrap();
        assert_eq!(read_all(&fs, a.fid, 1 << 20).await, &data[..70_000]);
    }
}

/// A striped component gets its OST objects at the first write that reaches it, not at
/// the create (Lustre's PFL instantiation): a small file whose first component is on the
/// MDT takes none. A mount that read the file before another gave it objects, and holds
/// no lease, does not trust its copy of the layout: it reads, truncates and sizes the file
/// by the objects the other gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_get_objects_at_the_first_write_that_reaches_them() {
    let t = TestFs::start(1, 2).await;
    let (a, b) = (t.mount("a").await, t.mount("b").await);
    let c = Creds::default();
    let dir = a.mkdir(&c, Fid::ROOT, "pfl", 0o755, -1, 1).await.unwrap();
    a.set_dir_layout(&c, dir.fid, Some(&lfs("-E 64K -L mdt -E 1M -c 1 -E -1 -c 2 -S 64K"))).await.unwrap();
    let small = pattern(3, 3901);
    let (f, h) = a.create_open(&c, dir.fid, "f", 0o644, None, OpenFlags::READ_WRITE).await.unwrap();
    h.write(0, &small).await.unwrap();
    h.close().await.unwrap();
    // Objects per component (none listed: none yet).
    let counts = |l: Option<nacre_client::striping::FileLayout>| {
        let l = l.unwrap();
        (0..l.layout.components.len()).map(|i| l.objects.get(i).map_or(0, Vec::len)).collect::<Vec<_>>()
    };
    assert_eq!(counts(a.getlayout(&c, f.fid).await.unwrap()), vec![0, 0, 0], "a small file takes no object");
    assert_eq!(md_ops(&t, 0, "layout_intent"), 0);
    // The second mount reads it, and keeps it open: its layout has no objects.
    assert_eq!(read_all(&b, f.fid, 1 << 20).await, small);
    let open_before = b.open(&c, f.fid, OpenFlags::READ).await.unwrap();
    // The first writes past 64 KiB: the second component gets its object, not the third.
    let h = a.open(&c, f.fid, OpenFlags::WRITE).await.unwrap();
    h.write(100_000, b"tail").await.unwrap();
    h.write(100_004, b"more").await.unwrap();
    h.close().await.unwrap();
    assert_eq!(counts(a.getlayout(&c, f.fid).await.unwrap()), vec![0, 1, 0]);
    assert_eq!(md_ops(&t, 0, "layout_intent"), 1, "one intent for the component, not one per write");
    let mut want = small.clone();
    want.resize(100_000, 0);
    want.extend_from_slice(b"tailmore");
    let got = open_before.read(0, 1 << 20).await.unwrap();
    assert!(got == want, "the handle opened before the object was given reads the bytes on it");
    open_before.close().await.unwrap();
    // The first writes far out: the third component gets its objects. The second mount
    // cuts the file and extends it again with its old copy of the layout (without those
    // objects) cached: the bytes on them are cut too.
    let h = a.open(&c, f.fid, OpenFlags::WRITE).await.unwrap();
    h.write(5 << 20, b"far").await.unwrap();
    h.close().await.unwrap();
    assert_eq!(counts(a.getlayout(&c, f.fid).await.unwrap()), vec![0, 1, 2]);
    let cut = |size| SetAttr { mask: set::SIZE, size, ..SetAttr::default() };
    b.setattr(&c, f.fid, cut(70_000)).await.unwrap();
    b.setattr(&c, f.fid, cut(6 << 20)).await.unwrap();
    for fs in [&a, &b] {
        let got = read_all(fs, f.fid, 1 << 20).await;
        assert_eq!(got.len(), 6 << 20);
        assert_eq!(&got[..3901], &small[..]);
        assert!(got[3901..].iter().all(|&x| x == 0), "bytes the truncate should have cut came back");
    }
    // A truncate asks for a layout that may have changed once, however many steps use it.
    let (g, h) = a.create_open(&c, dir.fid, "g", 0o644, None, OpenFlags::WRITE).await.unwrap();
    h.write(100_000, b"past the DoM component").await.unwrap();
    h.close().await.unwrap();
    let fetched = md_ops(&t, 0, "getlayout");
    b.setattr(&c, g.fid, cut(70_000)).await.unwrap();
    assert_eq!(md_ops(&t, 0, "getlayout"), fetched + 1, "one layout fetch for the truncate");
    assert_eq!(b.getattr(&c, g.fid).await.unwrap().size, 70_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_direct_and_bounded_write_behind() {
    let t = TestFs::start(1, 2).await;
    let fs = t.mount("c").await;
    let c = Creds::default();
    let a = fs.create(&c, Fid::ROOT, "log", 0o644, Some(&lfs("-c 2 -S 64K"))).await.unwrap();
    let f = fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    f.write(0, b"first\n").await.unwrap();
    f.close().await.unwrap();
    let f = fs.open(&c, a.fid, OpenFlags { append: true, ..OpenFlags::WRITE }).await.unwrap();
    for i in 0..100 {
        // The offset is ignored: appends go to the end.
        f.write(0, format!("line {i}\n").as_bytes()).await.unwrap();
    }
    f.close().await.unwrap();
    let text = String::from_utf8(read_all(&fs, a.fid, 1000).await).unwrap();
    assert!(text.starts_with("first\nline 0\nline 1\n") && text.ends_with("line 99\n"), "{text}");
    // O_DIRECT: every call goes to the servers.
    let d = fs.open(&c, a.fid, OpenFlags { direct: true, ..OpenFlags::READ_WRITE }).await.unwrap();
    d.write(3, b"ST").await.unwrap();
    assert_eq!(d.read(0, 6).await.unwrap(), b"firST\n");
    d.close().await.unwrap();
    // A 1 MiB dirty budget and a 12 MiB write: write-back keeps up, nothing is lost.
    fs.set_param("llite.*.max_dirty_mb", "1").unwrap();
    let big = fs.create(&c, Fid::ROOT, "big", 0o644, Some(&lfs("-c 2 -S 64K"))).await.unwrap();
    let f = fs.open(&c, big.fid, OpenFlags::WRITE).await.unwrap();
    let data = pattern(11, 12 << 20);
    write_in(&f, 0, &data, &[256 << 10]).await;
    f.close().await.unwrap();
    assert!(read_all(&fs, big.fid, 1 << 20).await == data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_operations_and_their_errors() {
    let t = TestFs::start(1, 1).await;
    let fs = t.mount("c").await;
    let c = Creds::default();
    let d = fs.mkdir(&c, Fid::ROOT, "d", 0o755, -1, 0).await.unwrap();
    for i in 0..25 {
        fs.create(&c, d.fid, &format!("f{i:02}"), 0o644, None).await.unwrap();
    }
    assert_eq!(fs.create(&c, d.fid, "f00", 0o644, None).await.unwrap_err().errno, errno::EEXIST);
    assert_eq!(fs.lookup(&c, d.fid, "nope").await.unwrap_err().errno, errno::ENOENT);
    assert_eq!(fs.resolve(&c, "/d/f07").await.unwrap().fid, fs.lookup(&c, d.fid, "f07").await.unwrap().fid);
    assert_eq!(fs.resolve(&c, "/d/nope/x").await.unwrap_err().errno, errno::ENOENT);
    // Listing in pages of 7, resumed by cookie.
    let mut names = Vec::new();
    let mut cookie = 0;
    loop {
        let (entries, eof) = fs.readdir(&c, d.fid, cookie, 7).await.unwrap();
        assert!(entries.len() <= 7);
        for (e, a) in &entries {
            assert_eq!(e.fid, a.fid);
            names.push(e.name.clone());
            cookie = e.cookie;
        }
        if eof {
            break;
        }
    }
    names.sort();
    assert_eq!(names, (0..25).map(|i| format!("f{i:02}")).collect::<Vec<_>>());
    // Rename: no-replace refuses, replace replaces.
    assert_eq!(fs.rename(&c, d.fid, "f01", d.fid, "f02", true).await.unwrap_err().errno, errno::EEXIST);
    let f1 = fs.lookup(&c, d.fid, "f01").await.unwrap();
    fs.rename(&c, d.fid, "f01", Fid::ROOT, "moved", false).await.unwrap();
    assert_eq!(fs.lookup(&c, Fid::ROOT, "moved").await.unwrap().fid, f1.fid);
    // Links, symlinks, xattrs.
    let l = fs.link(&c, f1.fid, d.fid, "again").await.unwrap();
    assert_eq!(l.nlink, 2);
    let s = fs.symlink(&c, d.fid, "sl", b"../moved").await.unwrap();
    assert_eq!(fs.readlink(&c, s.fid).await.unwrap(), b"../moved");
    fs.setxattr(&c, f1.fid, "user.k", b"v", 0).await.unwrap();
    assert_eq!(fs.getxattr(&c, f1.fid, "user.k").await.unwrap(), b"v");
    assert_eq!(fs.listxattr(&c, f1.fid).await.unwrap(), vec!["user.k".to_string()]);
    fs.removexattr(&c, f1.fid, "user.k").await.unwrap();
    assert_eq!(fs.getxattr(&c, f1.fid, "user.k").await.unwrap_err().errno, errno::ENODATA);
    // Removing.
    assert_eq!(fs.rmdir(&c, Fid::ROOT, "d").await.unwrap_err().errno, errno::ENOTEMPTY);
    assert_eq!(fs.unlink(&c, Fid::ROOT, "d").await.unwrap_err().errno, errno::EISDIR);
    assert_eq!(fs.create(&c, d.fid, &"n".repeat(256), 0o644, None).await.unwrap_err().errno, errno::ENAMETOOLONG);
    let bad = fs.create(&c, d.fid, "bad", 0o644, Some(&Layout { components: vec![] })).await.unwrap_err();
    assert_eq!(bad.errno, errno::EINVAL, "{bad}");
    // Create-open: made and opened at once, even with a mode that denies writing (as
    // open(2) with O_CREAT); a second one of the same name is EEXIST.
    let (a, f) = fs.create_open(&c, d.fid, "made-open", 0o444, None, OpenFlags::WRITE).await.unwrap();
    f.write(0, b"through the create").await.unwrap();
    f.close().await.unwrap();
    assert_eq!(a.mode & 0o777, 0o444);
    assert_eq!(read_all(&fs, a.fid, 100).await, b"through the create");
    let e = fs.create_open(&c, d.fid, "made-open", 0o644, None, OpenFlags::WRITE).await.err().unwrap();
    assert_eq!(e.errno, errno::EEXIST);
    // A non-root user: permission bits hold.
    let user = Creds { uid: 1000, gid: 1000, ..Creds::default() };
    assert_eq!(fs.create(&user, d.fid, "mine", 0o644, None).await.unwrap_err().errno, errno::EACCES);
    assert_eq!(fs.open(&user, f1.fid, OpenFlags::WRITE).await.err().unwrap().errno, errno::EACCES);
    // Space over every target: one MDT and one OST.
    let s = fs.statfs(&c).await.unwrap();
    assert_eq!(s.targets.len(), 2);
    assert!(s.bytes_total > 0 && s.bytes_free <= s.bytes_total && s.inodes >= 27, "{s:?}");
    assert_eq!(s.targets[1].name, "testfs-OST0000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn striped_directories_route_every_name_to_its_shard() {
    let t = TestFs::start(2, 1).await;
    let fs = t.mount("c").await;
    let c = Creds::default();
    let sd = fs.mkdir(&c, Fid::ROOT, "striped", 0o755, -1, 2).await.unwrap();
    let remote = fs.mkdir(&c, Fid::ROOT, "on1", 0o755, 1, 1).await.unwrap();
    assert_eq!(remote.fid.mdt(), Some(1));
    let (stripe, _) = fs.getdirstripe(&c, sd.fid).await.unwrap();
    assert_eq!(stripe.unwrap().shards.len(), 2);
    for i in 0..40 {
        fs.create(&c, sd.fid, &format!("n{i}"), 0o644, None).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut cookie = 0;
    loop {
        let (entries, eof) = fs.readdir(&c, sd.fid, cookie, 9).await.unwrap();
        for (e, _) in &entries {
            seen.push(e.name.clone());
            cookie = e.cookie;
        }
        if eof {
            break;
        }
    }
    seen.sort();
    let mut want: Vec<String> = (0..40).map(|i| format!("n{i}")).collect();
    want.sort();
    assert_eq!(seen, want);
    let mut mdts = std::collections::BTreeSet::new();
    for n in &seen {
        mdts.insert(fs.lookup(&c, sd.fid, n).await.unwrap().fid.mdt());
    }
    assert_eq!(mdts.len(), 2, "the names are spread over both MDTs");
    // Files on both MDTs, written and read through the shards.
    let a = fs.lookup(&c, sd.fid, "n3").await.unwrap();
    let f = fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    f.write(0, b"in a shard").await.unwrap();
    f.close().await.unwrap();
    assert_eq!(read_all(&fs, a.fid, 100).await, b"in a shard");
    fs.rename(&c, sd.fid, "n3", sd.fid, "renamed", false).await.unwrap();
    fs.rename(&c, sd.fid, "renamed", remote.fid, "there", false).await.unwrap();
    assert_eq!(fs.lookup(&c, remote.fid, "there").await.unwrap().fid, a.fid);
    for i in (0..40).filter(|&i| i != 3) {
        fs.unlink(&c, sd.fid, &format!("n{i}")).await.unwrap();
    }
    assert!(fs.readdir(&c, sd.fid, 0, 100).await.unwrap().0.is_empty());
    fs.rmdir(&c, Fid::ROOT, "striped").await.unwrap();
    assert_eq!(fs.lookup(&c, Fid::ROOT, "striped").await.unwrap_err().errno, errno::ENOENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunables_are_listed_checked_and_followed_from_the_mgs() {
    let t = TestFs::start(1, 2).await;
    let fs = t.mount("c").await;
    let p = fs.get_param("osc.*.max_rpcs_in_flight");
    assert_eq!(
        p,
        vec![
            ("osc.testfs-OST0000-osc.max_rpcs_in_flight".to_string(), "8".to_string()),
            ("osc.testfs-OST0001-osc.max_rpcs_in_flight".to_string(), "8".to_string()),
        ]
    );
    fs.set_param("osc.*.max_pages_per_rpc", "16").unwrap();
    assert_eq!(fs.get_param("osc.testfs-OST0000-osc.max_pages_per_rpc")[0].1, "16");
    let e = fs.set_param("osc.*.max_pages_per_rpc", "0").unwrap_err();
    assert!(e.errno == errno::EINVAL && e.message.contains("1..="), "{e}");
    let e = fs.set_param("osc.*.max_pages_per_rpc", "lots").unwrap_err();
    assert!(e.message.contains("not a number"), "{e}");
    assert_eq!(fs.get_param("osc.testfs-OST0000-osc.max_pages_per_rpc")[0].1, "16", "a refused value changes nothing");
    assert_eq!(fs.set_param("osc.*.no_such_knob", "1").unwrap_err().errno, errno::ENOENT);
    assert_eq!(fs.set_param("osc.*.short_io_bytes", "1").unwrap_err().errno, errno::EINVAL);
    // 64 KiB RPCs and checksums off still read back right.
    fs.set_param("osc.*.checksums", "0").unwrap();
    let c = Creds::default();
    let a = fs.create(&c, Fid::ROOT, "small-rpcs", 0o644, Some(&lfs("-c 2 -S 64K"))).await.unwrap();
    let f = fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    let data = pattern(5, 1 << 20);
    f.write(0, &data).await.unwrap();
    f.close().await.unwrap();
    assert!(read_all(&fs, a.fid, 1 << 20).await == data);
    // `set-param -P` on the MGS reaches mounted clients.
    t.local.mgs_service().unwrap().set_param("osc.*.max_rpcs_in_flight", "3").unwrap();
    let started = std::time::Instant::now();
    while fs.get_param("osc.testfs-OST0001-osc.max_rpcs_in_flight")[0].1 != "3" {
        assert!(started.elapsed().as_secs() < 20, "the MGS's value never reached the client");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_ahead_after_the_file_grows_returns_the_new_bytes() {
    let t = TestFs::start(1, 2).await;
    let (a_fs, b_fs) = (t.mount("a").await, t.mount("b").await);
    let c = Creds::default();
    let a = a_fs.create(&c, Fid::ROOT, "grows", 0o644, Some(&lfs("-c 2 -S 64K"))).await.unwrap();
    let all = pattern(21, 9 << 20);
    let w = a_fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    w.write(0, &all[..5 << 20]).await.unwrap();
    w.close().await.unwrap();
    // B reads to the end in 1 MiB calls: its read-ahead holds a short chunk at the end.
    let r = b_fs.open(&c, a.fid, OpenFlags::READ).await.unwrap();
    for k in 0..5u64 {
        assert!(r.read(k << 20, 1 << 20).await.unwrap() == all[(k << 20) as usize..((k + 1) << 20) as usize]);
    }
    assert!(r.read(5 << 20, 1 << 20).await.unwrap().is_empty(), "end of file");
    // A appends 4 MiB; B, still open, reads on and gets them (not zeros, not shifted).
    let w = a_fs.open(&c, a.fid, OpenFlags { append: true, ..OpenFlags::WRITE }).await.unwrap();
    w.write(0, &all[5 << 20..]).await.unwrap();
    w.close().await.unwrap();
    for k in 5..9u64 {
        let got = r.read(k << 20, 1 << 20).await.unwrap();
        assert!(got == all[(k << 20) as usize..((k + 1) << 20) as usize], "MiB {k} after the file grew");
    }
    let across = r.read((4 << 20) + 12_345, 3 << 20).await.unwrap();
    assert!(across == all[(4 << 20) + 12_345..(7 << 20) + 12_345]);
    r.close().await.unwrap();
}

/// Many files each holding a little dirty data can spend the whole dirty budget; a
/// write that finds no room then goes straight out instead of waiting for files that
/// nobody writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_dirty_budget_never_blocks_a_writer() {
    let t = TestFs::start(1, 2).await;
    let fs = t.mount("c").await;
    fs.set_param("llite.*.max_dirty_mb", "1").unwrap();
    let c = Creds::default();
    let mut files = Vec::new();
    for i in 0..24 {
        let a = fs.create(&c, Fid::ROOT, &format!("small{i}"), 0o644, None).await.unwrap();
        files.push(fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap());
    }
    let written = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        for round in 0..3u64 {
            for (i, f) in files.iter().enumerate() {
                f.write(round * 100_000, &pattern(i as u64 * 10 + round, 100_000)).await.unwrap();
            }
        }
    })
    .await;
    assert!(written.is_ok(), "a writer waited on the dirty budget");
    for f in &files {
        f.close().await.unwrap();
    }
    for (i, f) in files.iter().enumerate() {
        let got = read_all(&fs, f.fid(), 1 << 20).await;
        let want: Vec<u8> = (0..3).flat_map(|r| pattern(i as u64 * 10 + r, 100_000)).collect();
        assert!(got == want, "file {i}");
    }
}

/// The MDT operations `name` has served so far (its `md_stats`).
fn md_ops(t: &TestFs, mdt: usize, name: &str) -> u64 {
    let stats = t.local.mdses()[mdt].get_param("mdt.*.md_stats");
    stats[0].1.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).map_or(0, |n| n.parse().unwrap())
}

/// An open by name is one request, and a small DoM file comes with it: reading it costs no
/// further RPC. In a striped directory the name goes to its shard; an entry whose inode is
/// on another MDT (a link) is opened there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_by_name_reads_a_small_dom_file_with_the_open() {
    let t = TestFs::start(2, 2).await;
    let fs = t.mount("c1").await;
    let c = Creds::default();
    let dom = lfs("-E 1M -L mdt -E eof -c 1");
    let sd = fs.mkdir(&c, Fid::ROOT, "striped", 0o755, -1, 2).await.unwrap();
    fs.set_dir_layout(&c, sd.fid, Some(&dom)).await.unwrap();
    let body = pattern(31, 3901);
    let mut made = Vec::new();
    for i in 0..8 {
        let a = fs.create_with_data(&c, sd.fid, &format!("f{i}"), 0o644, &body).await.unwrap();
        made.push(a.fid);
    }
    let dom_reads = |t: &TestFs| md_ops(t, 0, "dom_read") + md_ops(t, 1, "dom_read");
    let before = dom_reads(&t);
    for (i, fid) in made.iter().enumerate() {
        let f = fs.open_at(&c, sd.fid, &format!("f{i}"), OpenFlags::READ).await.unwrap();
        assert_eq!(f.fid(), *fid);
        // Its layout has an OST component: a writer elsewhere may have written past the
        // MDT's size, so no read is answered without asking.
        assert!(f.read_ready(0, 4096).is_none(), "f{i}");
        assert_eq!(f.read(0, 1 << 20).await.unwrap(), body, "f{i}");
        f.close().await.unwrap();
    }
    assert_eq!(dom_reads(&t), before, "the opens brought the bytes");
    // With DoM components only, the size the open gave is exact: a read is ready without
    // waiting (what the kernel reader's thread answers itself), a page across the end
    // included; past the end it needs a real read.
    let only = fs.mkdir(&c, Fid::ROOT, "dom-only", 0o755, -1, 1).await.unwrap();
    fs.set_dir_layout(&c, only.fid, Some(&lfs("-E 1M -L mdt"))).await.unwrap();
    fs.create_with_data(&c, only.fid, "small", 0o644, &body).await.unwrap();
    let f = fs.open_at(&c, only.fid, "small", OpenFlags::READ).await.unwrap();
    assert_eq!(f.read_ready(0, 4096).as_deref(), Some(&body[..]));
    assert_eq!(f.read_ready(100, 50).as_deref(), Some(&body[100..150]));
    assert!(f.read_ready(3901, 10).is_none());
    assert_eq!(f.read(0, 4096).await.unwrap(), body);
    f.close().await.unwrap();
    // The opens brought the layouts too: writing and reading files made or opened here,
    // on the MDT (DoM) and on an OST, fetches none, and another mount's open brings them.
    // One exception: the small file's striped component has no objects yet, and the
    // other mount holds no lease (these mounts take none), so its read past the end asks
    // for the layout again (another writer may have given it objects), where it used to
    // ask the OSTs for their sizes.
    let layouts = |t: &TestFs| md_ops(t, 0, "getlayout") + md_ops(t, 1, "getlayout");
    let before = layouts(&t);
    let other = t.mount("c2").await;
    let big = pattern(32, 1_200_000);
    for (i, data) in [&body, &big].into_iter().enumerate() {
        let (_, f) = fs.create_open(&c, sd.fid, &format!("made{i}"), 0o644, None, OpenFlags::READ_WRITE).await.unwrap();
        f.write(0, data).await.unwrap();
        f.close().await.unwrap();
        let f = other.open_at(&c, sd.fid, &format!("made{i}"), OpenFlags::READ).await.unwrap();
        assert_eq!(&f.read(0, 2 << 20).await.unwrap(), data, "made{i}");
        f.close().await.unwrap();
    }
    assert_eq!(layouts(&t), before + 1, "one layout fetched: the small file's, by the mount without a lease");
    // Opened for writing, or O_DIRECT: no bytes with the open, and reads still right.
    let before = dom_reads(&t);
    let f = fs.open_at(&c, sd.fid, "f0", OpenFlags::READ_WRITE).await.unwrap();
    f.write(0, b"new").await.unwrap();
    assert!(f.read_ready(0, 10).is_none(), "written here, not sent: a real read");
    let mut want = body.clone();
    want[..3].copy_from_slice(b"new");
    assert_eq!(f.read(0, 1 << 20).await.unwrap(), want);
    f.close().await.unwrap();
    let direct = OpenFlags { direct: true, ..OpenFlags::READ };
    let f = fs.open_at(&c, sd.fid, "f0", direct).await.unwrap();
    assert_eq!(f.read(0, 1 << 20).await.unwrap(), want);
    f.close().await.unwrap();
    assert!(dom_reads(&t) >= before + 2, "each of the two reads read the MDT");

    // A link on MDT 1 to a file on MDT 0.
    let on1 = fs.mkdir(&c, Fid::ROOT, "on1", 0o755, 1, 1).await.unwrap();
    let a = fs.create(&c, Fid::ROOT, "target", 0o644, None).await.unwrap();
    fs.link(&c, a.fid, on1.fid, "link").await.unwrap();
    let f = fs.open_at(&c, on1.fid, "link", OpenFlags::WRITE).await.unwrap();
    assert_eq!(f.fid(), a.fid);
    f.write(0, b"via the link").await.unwrap();
    f.close().await.unwrap();
    let f = fs.open_at(&c, Fid::ROOT, "target", OpenFlags::READ).await.unwrap();
    assert_eq!(f.read(0, 100).await.unwrap(), b"via the link");
    f.close().await.unwrap();
    // Errors: no such name, a directory, a name that is too long.
    assert_eq!(fs.open_at(&c, Fid::ROOT, "absent", OpenFlags::READ).await.err().map(|e| e.errno), Some(errno::ENOENT));
    assert_eq!(fs.open_at(&c, Fid::ROOT, "on1", OpenFlags::READ).await.err().map(|e| e.errno), Some(errno::EISDIR));
    let long = "n".repeat(300);
    assert_eq!(
        fs.open_at(&c, Fid::ROOT, &long, OpenFlags::READ).await.err().map(|e| e.errno),
        Some(errno::ENAMETOOLONG)
    );
}

/// Statahead: lookups of numbered names in order (mdtest's stat phase) are answered
/// from attributes fetched ahead, many names per request, in a plain and in a striped
/// directory. What comes back equals what a lookup of its own gives; a change from this
/// mount makes the answers fetched before it unusable; a name that is missing is still
/// ENOENT; another mount's change shows once the answers are older than a second; and
/// `statahead_max=0` turns it off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbered_lookups_in_order_are_answered_from_statahead() {
    const N: usize = 300;
    let t = TestFs::start(2, 1).await;
    let fs = t.mount("c1").await;
    let c = Creds::default();
    let plain = fs.mkdir(&c, Fid::ROOT, "plain", 0o755, 0, 1).await.unwrap();
    let striped = fs.mkdir(&c, Fid::ROOT, "striped", 0o755, -1, 2).await.unwrap();
    let lookups = |t: &TestFs| md_ops(t, 0, "lookup") + md_ops(t, 1, "lookup");
    let batches = |t: &TestFs| md_ops(t, 0, "lookup_many") + md_ops(t, 1, "lookup_many");
    for dir in [plain.fid, striped.fid] {
        let mut made = Vec::new();
        for i in 0..N {
            // One file missing from the sequence: it must stay ENOENT.
            if i == 100 {
                continue;
            }
            made.push((i, fs.create(&c, dir, &format!("file.mdtest.0.{i}"), 0o644, None).await.unwrap()));
        }
        let (l0, b0) = (lookups(&t), batches(&t));
        for &(i, ref a) in &made[..150] {
            let got = fs.lookup(&c, dir, &format!("file.mdtest.0.{i}")).await.unwrap();
            assert_eq!(got, *a, "file.mdtest.0.{i}");
            if i == 99 {
                let e = fs.lookup(&c, dir, "file.mdtest.0.100").await.unwrap_err();
                assert_eq!(e.errno, errno::ENOENT);
            }
        }
        let (asked, fetched) = (lookups(&t) - l0, batches(&t) - b0);
        assert!(asked < 20, "{asked} single lookups for 150 names");
        assert!(fetched > 0 && fetched < 40, "{fetched} lookup-many requests");
        // A change from this mount: answers fetched before it are not used. The size set
        // here is what the next lookup must see.
        let (i, a) = &made[150];
        let f = fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
        f.close().await.unwrap();
        fs.setattr(&c, made[151].1.fid, SetAttr { mask: set::SIZE, size: 7, ..Default::default() }).await.unwrap();
        assert_eq!(fs.lookup(&c, dir, &format!("file.mdtest.0.{i}")).await.unwrap().fid, a.fid);
        let (j, _) = &made[151];
        assert_eq!(fs.lookup(&c, dir, &format!("file.mdtest.0.{j}")).await.unwrap().size, 7);
    }

    // Another mount's change is seen once the answers fetched here are older than
    // STATAHEAD_AGE.
    let other = t.mount("c2").await;
    for i in 160..170 {
        fs.lookup(&c, plain.fid, &format!("file.mdtest.0.{i}")).await.unwrap();
    }
    let next = other.lookup(&c, plain.fid, "file.mdtest.0.170").await.unwrap();
    other.setattr(&c, next.fid, SetAttr { mask: set::SIZE, size: 99, ..Default::default() }).await.unwrap();
    tokio::time::sleep(nacre_client::STATAHEAD_AGE + std::time::Duration::from_millis(50)).await;
    assert_eq!(fs.lookup(&c, plain.fid, "file.mdtest.0.170").await.unwrap().size, 99);

    // Without waiting (the mount's kernel readers): a name fetched ahead is there at
    // once; a file open for writing here is not (its size needs a glimpse).
    for i in 180..184 {
        fs.lookup(&c, plain.fid, &format!("file.mdtest.0.{i}")).await.unwrap();
    }
    let want = other.lookup(&c, plain.fid, "file.mdtest.0.184").await.unwrap();
    assert_eq!(fs.lookup_ready(&c, plain.fid, "file.mdtest.0.184"), Some(want));
    let written = other.lookup(&c, plain.fid, "file.mdtest.0.185").await.unwrap();
    let w = fs.open(&c, written.fid, OpenFlags::WRITE).await.unwrap();
    assert_eq!(fs.lookup_ready(&c, plain.fid, "file.mdtest.0.185"), None, "open for writing here");
    w.close().await.unwrap();

    // Off: every lookup is its own request.
    fs.set_param("llite.*.statahead_max", "0").unwrap();
    let l0 = lookups(&t);
    for i in 200..260 {
        fs.lookup(&c, plain.fid, &format!("file.mdtest.0.{i}")).await.unwrap();
    }
    assert_eq!(lookups(&t) - l0, 60);
    assert!(fs.set_param("llite.*.statahead_max", "9000").is_err());
}

/// ior-hard's reads: four handles of one file on one mount, each reading every fourth
/// block. The file's read-ahead chunks are shared by its handles, so the OSTs read each
/// byte about once, not once per handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_reading_interleaved_blocks_share_their_read_ahead() {
    const T: usize = 47_008;
    const SEGMENTS: usize = 64;
    let t = TestFs::start(1, 3).await;
    let fs = t.mount("c1").await;
    // 256 KiB chunks: the file is about 46 of them.
    fs.set_param("osc.*.max_pages_per_rpc", "64").unwrap();
    let c = Creds::default();
    let a = fs.create(&c, Fid::ROOT, "hard", 0o644, Some(&lfs("-C 6 -S 64K"))).await.unwrap();
    let f = fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    let data = Arc::new(pattern(12, 4 * SEGMENTS * T));
    write_in(&f, 0, &data, &[T]).await;
    f.close().await.unwrap();
    let before = t.ost_read_bytes();
    let start = Arc::new(tokio::sync::Barrier::new(4));
    let mut readers = Vec::new();
    for rank in 0..4usize {
        let (fs, c, data, start) = (fs.clone(), c.clone(), data.clone(), start.clone());
        readers.push(tokio::spawn(async move {
            let f = fs.open(&c, a.fid, OpenFlags::READ).await.unwrap();
            start.wait().await;
            for seg in 0..SEGMENTS {
                let off = (seg * 4 + rank) * T;
                let got = f.read(off as u64, T).await.unwrap();
                assert!(got == data[off..off + T], "rank {rank} segment {seg}");
            }
            f.close().await.unwrap();
        }));
    }
    for r in readers {
        r.await.unwrap();
    }
    let read = t.ost_read_bytes() - before;
    let size = data.len() as u64;
    // A cache per handle reads the whole file once per handle (4x).
    assert!(read >= size && read <= size * 3 / 2, "the OSTs read {read} bytes for a file of {size}");
}

/// Four handles of one file on one mount, each writing every fourth 47,008-byte block
/// (ior-hard's writes) of `segments` rounds, then fsync and close together; with
/// `max_dirty_mb` set to `budget_mb` if given. Returns the OST writes it took, after
/// checking that every byte landed.
async fn write_interleaved(t: &TestFs, segments: usize, budget_mb: Option<u64>) -> u64 {
    const T: usize = 47_008;
    let fs = t.mount("c1").await;
    if let Some(mb) = budget_mb {
        fs.set_param("llite.*.max_dirty_mb", &mb.to_string()).unwrap();
    }
    let c = Creds::default();
    let a = fs.create(&c, Fid::ROOT, "hard", 0o644, Some(&lfs("-C 6 -S 1M"))).await.unwrap();
    let data = Arc::new(pattern(13, 4 * segments * T));
    let writes = |t: &TestFs| t.osts.iter().map(|o| o.stats().writes).sum::<u64>();
    let before = writes(t);
    let (start, written) = (Arc::new(tokio::sync::Barrier::new(4)), Arc::new(tokio::sync::Barrier::new(4)));
    let mut writers = Vec::new();
    for rank in 0..4usize {
        let (fs, c, data, start, written) = (fs.clone(), c.clone(), data.clone(), start.clone(), written.clone());
        writers.push(tokio::spawn(async move {
            let f = fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
            start.wait().await;
            for seg in 0..segments {
                let off = (seg * 4 + rank) * T;
                f.write(off as u64, &data[off..off + T]).await.unwrap();
            }
            // ior's tasks end together too (the stonewall's wear-out).
            written.wait().await;
            f.fsync().await.unwrap();
            f.close().await.unwrap();
        }));
    }
    let done = tokio::time::timeout(std::time::Duration::from_secs(120), async {
        for w in writers {
            w.await.unwrap();
        }
    })
    .await;
    assert!(done.is_ok(), "a writer waited forever (budget {budget_mb:?})");
    let sent = writes(t) - before;
    let f = fs.open(&c, a.fid, OpenFlags::READ).await.unwrap();
    assert!(f.read(0, data.len()).await.unwrap() == data[..], "every block as written (budget {budget_mb:?})");
    f.close().await.unwrap();
    sent
}

/// ior-hard's writes: the file's write-behind is shared by its handles, so the blocks
/// join and reach the OSTs as few large writes, not one write per block; every byte
/// lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_writing_interleaved_blocks_share_their_write_behind() {
    let t = TestFs::start(1, 3).await;
    let sent = write_interleaved(&t, 64, None).await;
    // One write per block would be 256.
    assert!(sent <= 64, "the OSTs took {sent} writes for 256 blocks");
}

/// The same writes with a dirty budget of 1 MiB, a tenth of the file: the budget runs
/// out while the writers' blocks have not met, so the file's long extents go first, then
/// everything dirty, then writes go straight out. Nothing waits forever and every byte
/// lands where it belongs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_writers_on_a_spent_budget_still_land_every_byte() {
    let t = TestFs::start(1, 3).await;
    let sent = write_interleaved(&t, 64, Some(1)).await;
    assert!(sent > 0);
}

/// The OST requests of `kind` (`sync`, `write_bytes`, ...) served so far (their
/// `client_stats`).
fn ost_served(t: &TestFs, kind: &str) -> u64 {
    let prefix = format!("{kind}: {{ samples: ");
    t.local
        .osses()
        .iter()
        .flat_map(|o| o.get_param("obdfilter.*.client_stats"))
        .flat_map(|(_, v)| v.lines().map(str::to_string).collect::<Vec<_>>())
        .filter_map(|l| l.trim().strip_prefix(prefix.as_str())?.split([',', ' ']).next()?.parse::<u64>().ok())
        .sum()
}

fn ost_syncs(t: &TestFs) -> u64 {
    ost_served(t, "sync")
}

/// ior-hard from two nodes: each mount holds every other 47,008-byte block of one file,
/// so its dirty extents never meet. Each object's share goes in RPCs of many extents
/// (niobufs), not one RPC per block, and a third mount reads back every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_mounts_writing_interleaved_blocks_send_many_extents_per_rpc() {
    const T: usize = 47_008;
    const SEGMENTS: usize = 48;
    let t = TestFs::start(1, 3).await;
    let (a, b) = (t.mount("a").await, t.mount("b").await);
    let c = Creds::default();
    let f = a.create(&c, Fid::ROOT, "hard", 0o644, Some(&lfs("-c 2 -S 1M"))).await.unwrap();
    let data = Arc::new(pattern(17, 2 * SEGMENTS * T));
    let before = ost_served(&t, "write_bytes");
    let mut writers = Vec::new();
    for (rank, fs) in [a.clone(), b.clone()].into_iter().enumerate() {
        let (c, data) = (c.clone(), data.clone());
        writers.push(tokio::spawn(async move {
            let h = fs.open(&c, f.fid, OpenFlags::WRITE).await.unwrap();
            for seg in 0..SEGMENTS {
                let off = (seg * 2 + rank) * T;
                h.write(off as u64, &data[off..off + T]).await.unwrap();
            }
            h.fsync().await.unwrap();
            h.close().await.unwrap();
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let rpcs = ost_served(&t, "write_bytes") - before;
    // 96 blocks; each mount's 2.2 MB reach two objects, in RPCs of 4 MiB at most, each
    // block cut in two where it crosses a stripe.
    assert!(rpcs <= 8, "the OSTs took {rpcs} write RPCs for {} blocks", 2 * SEGMENTS);
    let r = t.mount("reader").await;
    let h = r.open(&c, f.fid, OpenFlags::READ).await.unwrap();
    assert!(h.read(0, data.len()).await.unwrap() == data[..], "every block as written");
    h.close().await.unwrap();
}

/// The write-behind is the file's: an fsync through a handle that wrote nothing still
/// sends another handle's bytes and makes them durable (the OSTs are asked to sync); with
/// nothing sent since, it asks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_of_any_handle_makes_the_files_written_bytes_durable() {
    let t = TestFs::start(1, 2).await;
    let fs = t.mount("c1").await;
    let c = Creds::default();
    let a = fs.create(&c, Fid::ROOT, "f", 0o644, Some(&lfs("-c 2 -S 64K"))).await.unwrap();
    let (w, r) =
        (fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap(), fs.open(&c, a.fid, OpenFlags::READ).await.unwrap());
    let data = pattern(41, 256 << 10);
    w.write(0, &data).await.unwrap();
    let before = ost_syncs(&t);
    r.fsync().await.unwrap();
    let after = ost_syncs(&t);
    assert!(after > before, "the reader's fsync synced nothing ({before} -> {after})");
    r.fsync().await.unwrap();
    assert_eq!(ost_syncs(&t), after, "nothing new to sync");
    assert_eq!(r.read(0, data.len()).await.unwrap(), data);
    w.close().await.unwrap();
    r.close().await.unwrap();
}

/// A handle's read-ahead, shared by the file's handles on one mount, does not outlive a
/// change: a write through another handle of the mount drops it at once, and a change
/// from another mount is seen by the next open (close-to-open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_read_ahead_sees_writes_here_and_opens_after_writes_elsewhere() {
    let t = TestFs::start(1, 2).await;
    let (fs1, fs2) = (t.mount("c1").await, t.mount("c2").await);
    let c = Creds::default();
    let a = fs1.create(&c, Fid::ROOT, "f", 0o644, Some(&lfs("-c 2 -S 64K"))).await.unwrap();
    let old = pattern(21, 1 << 20);
    let w = fs1.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    w.write(0, &old).await.unwrap();
    w.close().await.unwrap();
    // A reader that stays open keeps the file's chunks alive on mount 1.
    let keep = fs1.open(&c, a.fid, OpenFlags::READ).await.unwrap();
    assert_eq!(keep.read(0, 1 << 20).await.unwrap(), old);

    // Another handle of mount 1 writes: the reader's next read has the new bytes.
    let here = pattern(22, 4096);
    let w = fs1.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    w.write(8192, &here).await.unwrap();
    w.close().await.unwrap();
    let mut want = old.clone();
    want[8192..8192 + 4096].copy_from_slice(&here);
    assert_eq!(keep.read(0, 1 << 20).await.unwrap(), want);

    // Mount 2 overwrites the same bytes and closes; a handle opened on mount 1 after that
    // reads them, though the file's chunks were alive all along.
    let there = pattern(23, 1 << 20);
    let w = fs2.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    w.write(0, &there).await.unwrap();
    w.close().await.unwrap();
    let fresh = fs1.open(&c, a.fid, OpenFlags::READ).await.unwrap();
    assert_eq!(fresh.read(0, 1 << 20).await.unwrap(), there);
    fresh.close().await.unwrap();
    keep.close().await.unwrap();
}

/// ior-hard's reads: four readers of one file, each every fourth 47,008-byte block (a
/// stride the read-ahead must not mistake for a stream), then a sequential reader after a
/// strided run on the same handle: every byte as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strided_and_then_sequential_reads_return_what_was_written() {
    const T: usize = 47_008;
    let t = TestFs::start(1, 3).await;
    let fs = t.mount("c1").await;
    let c = Creds::default();
    let a = fs.create(&c, Fid::ROOT, "hard", 0o644, Some(&lfs("-C 6 -S 64K"))).await.unwrap();
    let f = fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    let data = pattern(11, 64 * T);
    write_in(&f, 0, &data, &[T]).await;
    f.close().await.unwrap();
    let mut readers = Vec::new();
    for rank in 0..4usize {
        let (fs, c, data) = (fs.clone(), c.clone(), data.clone());
        readers.push(tokio::spawn(async move {
            let f = fs.open(&c, a.fid, OpenFlags::READ).await.unwrap();
            for seg in 0..16usize {
                let off = (seg * 4 + rank) * T;
                let got = f.read(off as u64, T).await.unwrap();
                assert!(got == data[off..off + T], "rank {rank} segment {seg}");
            }
            // The same handle, now reading on from 0 in order.
            let mut at = 0;
            while at < data.len() {
                let got = f.read(at as u64, 100_000).await.unwrap();
                assert!(!got.is_empty() && got[..] == data[at..at + got.len()], "rank {rank} at {at}");
                at += got.len();
            }
            f.close().await.unwrap();
        }));
    }
    for r in readers {
        r.await.unwrap();
    }
}

/// An unlink brings back its directory's attributes, which answer the kernel's next
/// getattr of that directory once (it drops them at every unlink): they are the ones the
/// MDT has after the unlink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlink_leaves_its_directory_attributes_for_one_getattr() {
    let t = TestFs::start(1, 1).await;
    let fs = t.mount("c1").await;
    let c = Creds::default();
    let d = fs.mkdir(&c, Fid::ROOT, "d", 0o755, -1, 0).await.unwrap();
    fs.mkdir(&c, d.fid, "sub", 0o755, -1, 0).await.unwrap();
    fs.create(&c, d.fid, "f", 0o644, None).await.unwrap();
    assert!(fs.fresh_dir_attr(d.fid).is_none(), "nothing before an unlink");
    fs.unlink(&c, d.fid, "f").await.unwrap();
    let left = fs.fresh_dir_attr(d.fid).expect("the unlink's reply left the directory's attributes");
    assert_eq!(left, fs.getattr(&c, d.fid).await.unwrap(), "the MDT's, after the unlink");
    assert!(fs.fresh_dir_attr(d.fid).is_none(), "answered once");
    fs.rmdir(&c, d.fid, "sub").await.unwrap();
    assert_eq!(fs.fresh_dir_attr(d.fid).unwrap().nlink, 2, "rmdir too: the subdirectory's link is gone");
}

/// The mount's `read_ahead_stats` counter `name`.
fn ra_stat(fs: &FileSystem, name: &str) -> u64 {
    let text = fs.get_param("llite.*.read_ahead_stats").pop().unwrap().1;
    text.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap().parse().unwrap()
}

/// Read-ahead follows what a stream does: random reads, backward reads and strides wider
/// than a chunk fetch exactly what they ask (the OSTs read 4 KiB for a 4 KiB read);
/// sequential and strided streams are read ahead in chunks, the OSTs reading each byte
/// about once. Every read returns what was written, and `read_ahead_stats` counts each
/// kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_ahead_follows_sequential_and_strided_streams_and_stays_out_of_random_ones() {
    const CHUNK: u64 = 256 << 10;
    let t = TestFs::start(1, 2).await;
    let fs = t.mount("c1").await;
    fs.set_param("osc.*.max_pages_per_rpc", &(CHUNK / 4096).to_string()).unwrap();
    let c = Creds::default();
    let a = fs.create(&c, Fid::ROOT, "f", 0o644, Some(&lfs("-c 2 -S 1M"))).await.unwrap();
    let f = fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    let data = pattern(21, 16 << 20);
    write_in(&f, 0, &data, &[1 << 20]).await;
    f.close().await.unwrap();
    let b = fs.create(&c, Fid::ROOT, "g", 0o644, Some(&lfs("-c 2 -S 1M"))).await.unwrap();
    let f = fs.open(&c, b.fid, OpenFlags::WRITE).await.unwrap();
    write_in(&f, 0, &data, &[1 << 20]).await;
    f.close().await.unwrap();
    let size = data.len() as u64;
    let check = |got: &[u8], at: u64, what: &str| {
        assert!(got == &data[at as usize..at as usize + got.len()], "{what} read at {at} differs");
    };

    // Random 4 KiB reads, never next to each other: 4 KiB from the OSTs each.
    let r = fs.open(&c, a.fid, OpenFlags::READ).await.unwrap();
    let (before, random0, ahead0) =
        (t.ost_read_bytes(), ra_stat(&fs, "random_reads"), ra_stat(&fs, "chunks_read_ahead"));
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let blocks = size / 4096;
    for _ in 0..200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = (x % blocks) * 4096;
        let got = r.read(at, 4096).await.unwrap();
        assert_eq!(got.len(), 4096);
        check(&got, at, "random");
    }
    assert_eq!(t.ost_read_bytes() - before, 200 * 4096, "random reads fetch what they ask");
    assert!(ra_stat(&fs, "random_reads") - random0 >= 195, "nearly every read is random");
    assert_eq!(ra_stat(&fs, "chunks_read_ahead"), ahead0, "nothing read ahead of random reads");
    r.close().await.unwrap();

    // Backward 4 KiB reads from the end: the same.
    let r = fs.open(&c, a.fid, OpenFlags::READ).await.unwrap();
    let before = t.ost_read_bytes();
    for i in 1..=64 {
        let at = size - i * 4096;
        check(&r.read(at, 4096).await.unwrap(), at, "backward");
    }
    assert_eq!(t.ost_read_bytes() - before, 64 * 4096, "backward reads fetch what they ask");
    assert_eq!(ra_stat(&fs, "chunks_read_ahead"), ahead0);
    r.close().await.unwrap();

    // A stride wider than a chunk: what is asked.
    let r = fs.open(&c, a.fid, OpenFlags::READ).await.unwrap();
    let before = t.ost_read_bytes();
    for i in 0..12 {
        let at = i * (CHUNK + 8192);
        check(&r.read(at, 8192).await.unwrap(), at, "wide stride");
    }
    assert_eq!(t.ost_read_bytes() - before, 12 * 8192, "a wide stride fetches what it asks");
    assert_eq!(ra_stat(&fs, "chunks_read_ahead"), ahead0);
    r.close().await.unwrap();

    // A strided stream (one handle reading every third 47,008-byte block, as one of
    // ior-hard's tasks): read ahead too, every byte right.
    const T: u64 = 47_008;
    let r = fs.open(&c, a.fid, OpenFlags::READ).await.unwrap();
    let strided0 = ra_stat(&fs, "strided_reads");
    let mut at = 0;
    while at + T <= size {
        check(&r.read(at, T as usize).await.unwrap(), at, "strided");
        at += 3 * T;
    }
    assert!(ra_stat(&fs, "strided_reads") - strided0 >= size / (3 * T) - 3, "the stride is seen");
    assert!(ra_stat(&fs, "chunks_read_ahead") > ahead0, "a strided stream is read ahead");
    let ahead1 = ra_stat(&fs, "chunks_read_ahead");
    r.close().await.unwrap();

    // Sequential 64 KiB reads: read ahead, each byte from the OSTs about once.
    // (On a file of its own: the strided stream's chunks would answer it.)
    let r = fs.open(&c, b.fid, OpenFlags::READ).await.unwrap();
    let (before, seq0, hits0) = (t.ost_read_bytes(), ra_stat(&fs, "sequential_reads"), ra_stat(&fs, "hits"));
    let mut at = 0;
    while at < size {
        let got = r.read(at, 64 << 10).await.unwrap();
        check(&got, at, "sequential");
        at += got.len() as u64;
    }
    let read = t.ost_read_bytes() - before;
    assert!((size..=size + CHUNK).contains(&read), "the OSTs read {read} bytes for a sequential read of {size}");
    assert!(ra_stat(&fs, "sequential_reads") - seq0 >= size / (64 << 10) - 1);
    assert!(ra_stat(&fs, "chunks_read_ahead") > ahead1, "a stream is read ahead");
    assert!(ra_stat(&fs, "hits") - hits0 >= size / (64 << 10) * 3 / 4, "most stream reads find their chunk there");
    r.close().await.unwrap();

    // Writing to read_ahead_stats clears it.
    fs.set_param("llite.*.read_ahead_stats", "clear").unwrap();
    assert_eq!(ra_stat(&fs, "hits") + ra_stat(&fs, "random_reads"), 0);
}

/// The OSTs answer small writes before they commit them; a write through an O_SYNC or
/// O_DIRECT handle returns only once its bytes are on the OST's drives, and an fsync
/// commits what plain handles wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_and_direct_writes_return_once_on_the_drives() {
    let t = TestFs::start(1, 1).await;
    let fs = t.mount("c1").await;
    let c = Creds::default();
    let on_drives = |t: &TestFs| t.osts.iter().map(|o| o.stats().write_bytes).sum::<u64>();
    for (name, flags) in [
        ("sync", OpenFlags { sync: true, ..OpenFlags::READ_WRITE }),
        ("direct", OpenFlags { direct: true, ..OpenFlags::READ_WRITE }),
        ("plain", OpenFlags::READ_WRITE),
    ] {
        let a = fs.create(&c, Fid::ROOT, name, 0o644, Some(&lfs("-c 1"))).await.unwrap();
        let f = fs.open(&c, a.fid, flags).await.unwrap();
        let before = on_drives(&t);
        let data = pattern(31, 8192);
        assert_eq!(f.write(4096, &data).await.unwrap(), 8192);
        if name == "plain" {
            f.fsync().await.unwrap();
        }
        assert!(on_drives(&t) - before >= 8192, "{name}: the write is on the drives when it returns");
        assert!(f.read(4096, 8192).await.unwrap() == data, "{name}");
        f.close().await.unwrap();
    }
}

/// A write the write-behind takes at once (what the mount answers on the kernel's reader
/// thread, with no hop to the runtime): its bytes count in the size at once and land at
/// the fsync. What needs more is left to `File::write`, with nothing changed: a write
/// over dirty bytes, one that would fill a write-back, an append, an empty one, and any
/// on a handle not open for writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_taken_at_once_land_and_the_rest_are_left_to_the_full_path() {
    let t = TestFs::start(1, 2).await;
    let fs = t.mount("c1").await;
    fs.set_param("llite.*.max_dirty_mb", "1").unwrap();
    let c = Creds::default();
    let a = fs.create(&c, Fid::ROOT, "f", 0o644, Some(&lfs("-c 2 -S 64K"))).await.unwrap();
    let data = pattern(5, 300_000);
    let f = fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    assert_eq!(f.write_ready(0, &data[..100_000]), Some(100_000));
    assert_eq!(f.size_hint(), 100_000);
    assert!(f.may_be_dirty());
    assert_eq!(f.write_ready(50_000, &data[50_000..60_000]), None, "over dirty bytes");
    assert_eq!(f.write_ready(100_000, &[]), None, "empty");
    // A quarter of the 1 MiB budget makes a write-back: 100,000 + 200,000 bytes would.
    assert_eq!(f.write_ready(100_000, &data[100_000..300_000]), None, "a write-back's worth");
    assert_eq!(f.size_hint(), 100_000, "the refusals changed nothing");
    f.write(100_000, &data[100_000..300_000]).await.unwrap();
    let append = OpenFlags { append: true, ..OpenFlags::WRITE };
    let ap = fs.open(&c, a.fid, append).await.unwrap();
    assert_eq!(ap.write_ready(0, b"x"), None, "an append");
    let ro = fs.open(&c, a.fid, OpenFlags::READ).await.unwrap();
    assert_eq!(ro.write_ready(0, b"x"), None, "read only");
    for h in [&ro, &ap] {
        h.close().await.unwrap();
    }
    f.fsync().await.unwrap();
    f.close().await.unwrap();
    let other = t.mount("c2").await;
    let h = other.open(&c, a.fid, OpenFlags::READ).await.unwrap();
    assert!(h.read(0, 400_000).await.unwrap() == data, "every byte, from another mount");
    h.close().await.unwrap();
}

/// Figure `name` of the mount's `llite.*.whole_files`.
fn whole_figure(fs: &FileSystem, name: &str) -> u64 {
    let text = fs.get_param("llite.*.whole_files")[0].1.clone();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in whole_files: {text}"))
}

/// A mount taking leases opens a small file it wrote whole, or read whole, for reading
/// with no request to the MDT (`open_permitted`), and reads what was written; a truncate or
/// an open for writing here makes the next open ask the MDT, which then reads what the
/// file holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_file_known_whole_opens_with_no_request_until_this_mount_changes_it() {
    let t = TestFs::start(1, 1).await;
    // Leases even on what was just changed, so each step runs under one.
    t.local.mdses()[0].set_param("mdt.mdt0.lease_contended_ms", "0").unwrap();
    let fs = t.mount("c1").await;
    fs.start_leases(Arc::new(|_| {}));
    let c = Creds::default();
    let dom = lfs("-E 64K -L mdt -E eof -c 1");
    // Grants count once the callback channel is up: until then a create takes no lease.
    let probe = fs.create(&c, Fid::ROOT, "probe", 0o644, None).await.unwrap();
    let started = std::time::Instant::now();
    while !fs.attr_leased(probe.fid) {
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "no lease was ever granted");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        fs.getattr(&c, probe.fid).await.unwrap();
    }
    let body = pattern(41, 3901);
    let a = fs.create(&c, Fid::ROOT, "small", 0o644, Some(&dom)).await.unwrap();
    let f = fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    write_in(&f, 0, &body, &[1000, 901, 2000]).await;
    f.close().await.unwrap();
    // Its handles gone, this mount keeps no image of the file (the writes below start
    // from what the MDT has).
    drop(f);
    let opens = || md_ops(&t, 0, "open") + md_ops(&t, 0, "close") + md_ops(&t, 0, "dom_read");
    let read_fid = |fid: Fid, want: Vec<u8>| {
        let fs = fs.clone();
        async move {
            let f = fs.open_permitted(&Creds::default(), fid, OpenFlags::READ).await.unwrap();
            let got = f.read(0, 8192).await.unwrap();
            f.close().await.unwrap();
            assert!(got == want, "read {} bytes, not the {} written", got.len(), want.len());
        }
    };
    let read = |want: Vec<u8>| read_fid(a.fid, want);
    let before = opens();
    read(body.clone()).await;
    read(body.clone()).await;
    assert_eq!(opens(), before, "a file written whole here asked the MDT to be read");
    assert!(fs.get_param("llite.*.whole_files")[0].1.contains("opens_answered 2"));

    // Cut here: the next open asks the MDT and reads the cut file; it knows it whole then.
    fs.setattr(&c, a.fid, SetAttr { mask: set::SIZE, size: 100, ..SetAttr::default() }).await.unwrap();
    let before = opens();
    read(body[..100].to_vec()).await;
    assert!(opens() > before, "the open after a truncate did not ask the MDT");
    let before = opens();
    read(body[..100].to_vec()).await;
    assert_eq!(opens(), before, "a file read whole asked the MDT again");

    // Written in the middle through a handle opened here: read as written. With no image
    // of the file to write into, the open after asks the MDT again. The mount may still
    // hold the image its first writer began (it lives while anything of the file's does,
    // a write-back task's last moment included): then the truncate and this write went
    // into it, the close kept the file whole, and the open asks nothing. Which one it
    // was, `whole_files` says.
    let kept = || whole_figure(&fs, "kept");
    let kept_before = kept();
    let f = fs.open(&c, a.fid, OpenFlags::WRITE).await.unwrap();
    f.write(10, b"changed").await.unwrap();
    f.close().await.unwrap();
    let mut want = body[..100].to_vec();
    want[10..17].copy_from_slice(b"changed");
    let before = opens();
    let closed_whole = kept() > kept_before;
    read(want).await;
    if closed_whole {
        assert_eq!(opens(), before, "a file its writer's close kept whole asked the MDT to be read");
    } else {
        assert!(opens() > before, "the open after a write here, with no image of the file, did not ask the MDT");
    }

    // While a handle of its first writer lives here, the mount's image of the file does
    // too: a truncate and a later writer's bytes go into it, and that writer's close
    // makes the file known whole again.
    let b = fs.create(&c, Fid::ROOT, "imaged", 0o644, Some(&dom)).await.unwrap();
    let first = fs.open(&c, b.fid, OpenFlags::WRITE).await.unwrap();
    write_in(&first, 0, &body, &[4096]).await;
    first.close().await.unwrap();
    fs.setattr(&c, b.fid, SetAttr { mask: set::SIZE, size: 100, ..SetAttr::default() }).await.unwrap();
    let second = fs.open(&c, b.fid, OpenFlags::WRITE).await.unwrap();
    second.write(10, b"changed").await.unwrap();
    second.close().await.unwrap();
    let before = opens();
    let mut want = body[..100].to_vec();
    want[10..17].copy_from_slice(b"changed");
    read_fid(b.fid, want).await;
    assert_eq!(opens(), before, "the file this mount wrote, cut and wrote again asked the MDT to be read");
    drop(first);
}

/// Listen for lease callbacks, and wait until the MDT grants leases to this mount.
async fn leasing(fs: &FileSystem) {
    fs.start_leases(Arc::new(|_| {}));
    let c = Creds::default();
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = format!("lease-probe-{}", PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let probe = fs.create(&c, Fid::ROOT, &name, 0o644, None).await.unwrap();
    let started = std::time::Instant::now();
    while !fs.attr_leased(probe.fid) {
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "no lease was ever granted");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        fs.getattr(&c, probe.fid).await.unwrap();
    }
}

/// Under the file's `Locks` lease a mount's owners let go of locks and take them again
/// with no request; the MDS still holds them until another mount's lock or test
/// conflicts, when it calls the lease back and the mount lets go of what its owners no
/// longer hold, and only that: a lock still held stays, and a lock that waits for it is
/// granted at its unlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_let_go_under_their_lease_stay_at_the_mds_until_another_mount_conflicts() {
    use nacre_proto::mdt::lock::{READ, UNLOCK, WRITE};
    let t = TestFs::start(1, 1).await;
    // The lease is granted again at once after a callback, so each step runs under one.
    t.local.mdses()[0].set_param("mdt.mdt0.lease_contended_ms", "0").unwrap();
    let (a, b) = (t.mount("c1").await, t.mount("c2").await);
    leasing(&a).await;
    leasing(&b).await;
    let c = Creds::default();
    let file = a.create(&c, Fid::ROOT, "locked", 0o644, None).await.unwrap();
    let fa = a.open(&c, file.fid, OpenFlags::READ_WRITE).await.unwrap();
    let fb = Arc::new(b.open(&c, file.fid, OpenFlags::READ_WRITE).await.unwrap());
    let requests = || md_ops(&t, 0, "lock");

    fa.lock(1, 11, WRITE, 0, 9, false).await.unwrap();
    let before = requests();
    for _ in 0..50 {
        fa.lock(1, 11, UNLOCK, 0, 9, false).await.unwrap();
        fa.lock(1, 11, WRITE, 0, 9, false).await.unwrap();
        // A read lock under the write lock the MDS holds, and back.
        fa.lock(1, 11, READ, 2, 3, false).await.unwrap();
        fa.lock(1, 11, WRITE, 2, 3, false).await.unwrap();
    }
    fa.lock(1, 11, READ, 4, 5, false).await.unwrap();
    fa.lock(1, 11, UNLOCK, 6, 9, false).await.unwrap();
    assert_eq!(requests(), before, "locks taken and let go under the lease asked the MDS");

    // Mount b writes 8..=9, let go of by a: granted. A read of 0..=9 conflicts with the
    // write lock a's owner holds on 0..=3 (the MDS's own, now no more than that) and
    // with b's: refused. The read lock on 4..=5 stays a read lock: b may read it too.
    fb.lock(2, 22, WRITE, 8, 9, false).await.unwrap();
    assert_eq!(fb.test_lock(2, WRITE, 0, 9).await.unwrap(), Some((WRITE, 0, 3, 11)));
    let e = fb.lock(2, 22, READ, 0, 3, false).await.unwrap_err();
    assert_eq!(e.errno, errno::EAGAIN, "{e}");
    fb.lock(2, 22, READ, 4, 7, false).await.unwrap();
    let e = fa.lock(1, 11, WRITE, 9, 9, false).await.unwrap_err();
    assert_eq!(e.errno, errno::EAGAIN, "{e}");

    // A lock a's owner holds under the lease stays through the callback: b's lock waits
    // for it and is granted when a lets go of it (with a waiter, a request).
    fa.lock(1, 11, WRITE, 100, 109, false).await.unwrap();
    let waiter = tokio::spawn({
        let fb = fb.clone();
        async move { fb.lock(2, 22, WRITE, 105, 105, true).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "b was granted bytes a holds");
    fa.lock(1, 11, UNLOCK, 100, 109, false).await.unwrap();
    let granted = tokio::time::timeout(std::time::Duration::from_secs(10), waiter).await;
    granted.expect("the waiting lock was never granted").unwrap().unwrap();
    assert_eq!(fa.test_lock(1, READ, 100, 109).await.unwrap(), Some((WRITE, 105, 105, 22)));

    // Closing lets go of everything, kept or held.
    fa.close().await.unwrap();
    fb.unlock_all(2).await.unwrap();
    let fa = a.open(&c, file.fid, OpenFlags::READ_WRITE).await.unwrap();
    assert_eq!(fa.test_lock(1, WRITE, 0, u64::MAX).await.unwrap(), None);
    fa.close().await.unwrap();
    fb.close().await.unwrap();
}

/// Two owners of one mount: a lock the MDS keeps for one after it let go does not stand
/// in the other's way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_one_owner_let_go_under_the_lease_is_free_for_another_owner_of_the_mount() {
    use nacre_proto::mdt::lock::{UNLOCK, WRITE};
    let t = TestFs::start(1, 1).await;
    let a = t.mount("c1").await;
    leasing(&a).await;
    let c = Creds::default();
    let file = a.create(&c, Fid::ROOT, "locked", 0o644, None).await.unwrap();
    let f = a.open(&c, file.fid, OpenFlags::READ_WRITE).await.unwrap();
    f.lock(1, 11, WRITE, 0, 9, false).await.unwrap();
    let before = md_ops(&t, 0, "lock");
    f.lock(1, 11, UNLOCK, 0, 9, false).await.unwrap();
    assert_eq!(md_ops(&t, 0, "lock"), before, "the unlock asked the MDS");
    assert_eq!(f.test_lock(2, WRITE, 0, 9).await.unwrap(), None, "owner 1 let go of it");
    f.lock(2, 22, WRITE, 5, 5, false).await.unwrap();
    let e = f.lock(1, 11, WRITE, 0, 9, false).await.unwrap_err();
    assert_eq!(e.errno, errno::EAGAIN, "{e}");
    f.close().await.unwrap();
}

/// A change over two MDTs (a rename from a directory on one to a directory on the
/// other) answers once every mount holding a lease on what it changed has given it up,
/// as a change on one MDT does: the names on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_over_two_mdts_answers_after_the_leases_it_changed_are_given_up() {
    let t = TestFs::start(2, 1).await;
    let (a, b) = (t.mount("c1").await, t.mount("c2").await);
    // b's kernel takes its time to drop what a revocation names (its acknowledgement
    // waits for that, up to 100 ms): what it dropped is noted.
    let dropped = Arc::new(std::sync::Mutex::new(Vec::new()));
    b.start_leases({
        let dropped = dropped.clone();
        Arc::new(move |keys| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            dropped.lock().unwrap().extend(keys);
        })
    });
    leasing(&b).await;
    let c = Creds::default();
    let d0 = a.mkdir(&c, Fid::ROOT, "d0", 0o755, 0, 0).await.unwrap().fid;
    let d1 = a.mkdir(&c, Fid::ROOT, "d1", 0o755, 1, 0).await.unwrap().fid;
    assert_eq!((d0.mdt(), d1.mdt()), (Some(0), Some(1)));
    for round in 0..5 {
        let (from, to) = (format!("f{round}"), format!("g{round}"));
        a.create(&c, d0, &from, 0o644, None).await.unwrap();
        // b leases both names: the file under one, nothing under the other.
        let started = std::time::Instant::now();
        while !(b.name_leased(d0, &from) && b.name_leased(d1, &to)) {
            assert!(started.elapsed() < std::time::Duration::from_secs(10), "b was never granted the names");
            b.lookup(&c, d0, &from).await.unwrap();
            assert_eq!(b.lookup(&c, d1, &to).await.unwrap_err().errno, errno::ENOENT);
        }
        a.rename(&c, d0, &from, d1, &to, false).await.unwrap();
        let gone = dropped.lock().unwrap().clone();
        for (dir, name) in [(d0, &from), (d1, &to)] {
            assert!(!b.name_leased(dir, name), "round {round}: b still leases {name}");
            assert!(
                gone.contains(&nacre_client::LeaseKey::Name(dir, name.clone())),
                "round {round}: the rename answered before b's kernel dropped {name}: {gone:?}"
            );
        }
        assert_eq!(b.lookup(&c, d0, &from).await.unwrap_err().errno, errno::ENOENT);
        b.lookup(&c, d1, &to).await.unwrap();
    }
}

/// Locks held by the MDS, from `mdt.*.locks`.
fn mds_locks_held(t: &TestFs) -> u64 {
    let text = t.local.mdses()[0].get_param("mdt.*.locks")[0].1.clone();
    text.lines().find_map(|l| l.strip_prefix("held ")?.trim().parse().ok()).unwrap()
}

/// What the lease kept at the MDS goes with its owner's close (the mount remembers the
/// owner until then), and a waiter on the same mount is woken by another owner's unlock
/// (no unlock is kept at the MDS while someone here waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_lets_go_of_what_the_lease_kept_and_a_waiter_here_is_woken() {
    use nacre_proto::mdt::lock::{UNLOCK, WRITE};
    let t = TestFs::start(1, 1).await;
    let a = t.mount("c1").await;
    leasing(&a).await;
    let c = Creds::default();
    let file = a.create(&c, Fid::ROOT, "locked", 0o644, None).await.unwrap();
    let f = Arc::new(a.open(&c, file.fid, OpenFlags::READ_WRITE).await.unwrap());
    f.lock(1, 11, WRITE, 0, 9, false).await.unwrap();
    let before = md_ops(&t, 0, "lock");
    f.lock(1, 11, UNLOCK, 0, 9, false).await.unwrap();
    assert_eq!(md_ops(&t, 0, "lock"), before, "the unlock was kept");
    assert_eq!(mds_locks_held(&t), 1, "the MDS keeps the lock let go of");
    assert!(a.holds_locks(file.fid, 1), "the owner is remembered until its close");
    f.unlock_all(1).await.unwrap();
    assert_eq!(mds_locks_held(&t), 0, "the close let go of it at the MDS");
    assert!(!a.holds_locks(file.fid, 1));

    // Owner 2 waits for owner 1's lock; owner 1's unlock is a request, and wakes it.
    f.lock(1, 11, WRITE, 0, 9, false).await.unwrap();
    let waiter = tokio::spawn({
        let f = f.clone();
        async move { f.lock(2, 22, WRITE, 5, 5, true).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "owner 2 was granted bytes owner 1 holds");
    f.lock(1, 11, UNLOCK, 0, 9, false).await.unwrap();
    let granted = tokio::time::timeout(std::time::Duration::from_secs(10), waiter).await;
    granted.expect("the waiting lock was never granted").unwrap().unwrap();
    for owner in [1, 2] {
        f.unlock_all(owner).await.unwrap();
    }
    assert_eq!(mds_locks_held(&t), 0);
    f.close().await.unwrap();
}
