//! The file system through the kernel: `nacre up` with a FUSE mount, then what programs
//! do — checked against what Linux's local file system does with the same calls
//! (errors included), a seeded random-operation run after fsx against a model file, two
//! mounts sharing a file, `up` after the serving process was killed, and the MDS's
//! process killed under a live mount (replay).

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Up, free_port, nacre};

fn scratch(name: &str) -> PathBuf {
    common::scratch("mount", name)
}

impl Up {
    fn start(name: &str) -> Up {
        Up::start_with(name, &[])
    }

    /// With more `nacre up` options (the first up makes the file system with them).
    fn start_with(name: &str, extra: &[&str]) -> Up {
        Up::start_in(scratch(name), extra)
    }

    fn pid(&self) -> i32 {
        fs::read_to_string(self.data.join("nacre.pid")).unwrap().trim().parse().unwrap()
    }

    /// Operations `op` MDT 0 has served (its `md_stats`).
    fn mds_ops(&self, op: &str) -> u64 {
        figure(&mds_param(&self.mgs(), "mdt.*.md_stats"), op)
    }
}

/// `get-param p` (or `set-param p` when it holds `=`) on MDT 0, found through the MGS
/// at `mgs` (its first NID: where it serves now).
fn mds_param(mgs: &str, p: &str) -> String {
    let call = |verb: &str, server: &str, p: &str| {
        let out = nacre().args([verb, "--server", server, p]).output().unwrap();
        assert!(out.status.success(), "{verb} {p}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let targets = call("get-param", mgs, "mgs.*.targets");
    let nids = targets.lines().find_map(|l| l.strip_prefix("nacre-MDT0000 ")).expect("MDT 0 in the MGS's targets");
    let mdt = nids.trim().split(',').next().unwrap().to_string();
    call(if p.contains('=') { "set-param" } else { "get-param" }, &mdt, p)
}

/// The number after `name ` on a line of `text` (0 if none).
fn figure(text: &str, name: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).map_or(0, |n| n.trim().parse().unwrap())
}

/// What a call gave: a value rendered as text, or its errno.
type Outcome = Result<String, i32>;

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn o<T: std::fmt::Debug>(r: std::io::Result<T>) -> Outcome {
    r.map(|v| format!("{v:?}")).map_err(errno)
}

/// Run `f` as uid/gid 65534 (nobody) in a child process: its exit code is the errno of
/// the first failure, 0 if all went well.
fn as_nobody(script: &str) -> i32 {
    let status = Command::new("sh").arg("-c").arg(script).uid(65534).gid(65534).status().unwrap();
    status.code().unwrap_or(-1)
}

/// The POSIX behaviour suite: every step's outcome on `root`, in order.
fn posix_suite(root: &Path) -> Vec<(String, Outcome)> {
    let mut out: Vec<(String, Outcome)> = Vec::new();
    let mut step = |name: &str, r: Outcome| out.push((name.to_string(), r));
    let p = |n: &str| root.join(n);
    // Create flags.
    step("create", o(File::create(p("a")).map(|_| ())));
    step("excl on existing", o(OpenOptions::new().write(true).create_new(true).open(p("a")).map(|_| ())));
    step("write", o(fs::write(p("a"), b"hello world")));
    step("trunc", o(OpenOptions::new().write(true).truncate(true).open(p("a")).map(|_| ())));
    step("after trunc", o(fs::read(p("a"))));
    {
        let mut f = OpenOptions::new().append(true).create(true).open(p("log")).unwrap();
        f.write_all(b"one\n").unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.write_all(b"two\n").unwrap();
    }
    step("append", o(fs::read_to_string(p("log"))));
    // pread/pwrite, beyond 4 GiB, sparse.
    {
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(p("big")).unwrap();
        f.write_all_at(b"start", 0).unwrap();
        f.write_all_at(b"far", (5 << 30) + 7).unwrap();
        f.sync_all().unwrap();
        let mut b = [0u8; 3];
        f.read_exact_at(&mut b, (5 << 30) + 7).unwrap();
        step("read past 4 GiB", Ok(format!("{b:?}")));
        let mut hole = [1u8; 16];
        f.read_exact_at(&mut hole, 1 << 30).unwrap();
        step("hole", Ok(format!("{hole:?}")));
    }
    step("big size", o(fs::metadata(p("big")).map(|m| m.len())));
    // truncate, ftruncate.
    fs::write(p("t"), vec![7u8; 100_000]).unwrap();
    step("truncate down", o(OpenOptions::new().write(true).open(p("t")).and_then(|f| f.set_len(10))));
    step("after truncate", o(fs::read(p("t"))));
    step("extend", o(OpenOptions::new().write(true).open(p("t")).and_then(|f| f.set_len(20))));
    step("after extend", o(fs::read(p("t"))));
    step("fsync", o(File::open(p("t")).and_then(|f| f.sync_all())));
    step("fdatasync", o(OpenOptions::new().write(true).open(p("t")).and_then(|f| f.sync_data())));
    // chmod, chown, utimens.
    step("chmod", o(fs::set_permissions(p("t"), fs::Permissions::from_mode(0o640))));
    step("mode", o(fs::metadata(p("t")).map(|m| m.mode() & 0o7777)));
    step("chown", o(std::os::unix::fs::chown(p("t"), Some(65534), Some(65534))));
    step("owner", o(fs::metadata(p("t")).map(|m| (m.uid(), m.gid()))));
    std::os::unix::fs::chown(p("t"), Some(0), Some(0)).unwrap();
    {
        let f = File::open(p("t")).unwrap();
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        step("utimens", o(f.set_times(fs::FileTimes::new().set_modified(t).set_accessed(t))));
    }
    step("mtime", o(fs::metadata(p("t")).map(|m| m.mtime())));
    // Permissions as a non-root user.
    fs::create_dir(p("private")).unwrap();
    fs::set_permissions(p("private"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
    let q = |n: &str| p(n).display().to_string();
    step(
        "nobody writes root's file",
        Ok(as_nobody(&format!("echo x > {} 2>/dev/null || exit 13", q("t"))).to_string()),
    );
    step(
        "nobody lists private dir",
        Ok(as_nobody(&format!("ls {} >/dev/null 2>&1 || exit 13", q("private"))).to_string()),
    );
    step("nobody reads 0640 file", Ok(as_nobody(&format!("cat {} >/dev/null 2>&1 || exit 13", q("t"))).to_string()));
    fs::create_dir(p("pub")).unwrap();
    fs::set_permissions(p("pub"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::write(p("pub/roots"), b"r").unwrap();
    step(
        "sticky: nobody removes root's file",
        Ok(as_nobody(&format!("rm -f {} 2>/dev/null || exit 1", q("pub/roots"))).to_string()),
    );
    step("nobody creates in sticky dir", Ok(as_nobody(&format!("echo n > {} || exit 1", q("pub/mine"))).to_string()));
    step("nobody's file owner", o(fs::metadata(p("pub/mine")).map(|m| (m.uid(), m.gid()))));
    // A write or truncate by someone without CAP_FSETID drops setuid, and setgid where it
    // means set-group-id (group execute), as Linux's file_remove_privs.
    let mode_of = |n: &str| o(fs::metadata(p(n)).map(|m| format!("{:o} {}", m.mode() & 0o7777, m.len())));
    for (name, bits) in [("pub/su", 0o4777), ("pub/sg", 0o2777), ("pub/sgt", 0o2777)] {
        fs::write(p(name), b"root's").unwrap();
        fs::set_permissions(p(name), fs::Permissions::from_mode(bits)).unwrap();
    }
    step("nobody appends to a setuid file", Ok(as_nobody(&format!("echo x >> {}", q("pub/su"))).to_string()));
    step("setuid after nobody's append", mode_of("pub/su"));
    step("nobody appends to a setgid file", Ok(as_nobody(&format!("echo x >> {}", q("pub/sg"))).to_string()));
    step("setgid after nobody's append", mode_of("pub/sg"));
    step("nobody truncates a setgid file", Ok(as_nobody(&format!("truncate -s 2 {}", q("pub/sgt"))).to_string()));
    step("setgid after nobody's truncate", mode_of("pub/sgt"));
    // Permission is checked at open: through a descriptor opened for writing, ftruncate
    // and write work after the mode lost its write bits (the bytes on the MDT, and past
    // its 64 KiB on an OST).
    for (name, size) in [("pub/small", 10), ("pub/large", 100_000)] {
        let script = format!(
            "head -c {size} /dev/zero > {f} && python3 -c \"import os; fd = os.open('{f}', os.O_RDWR); \
             os.chmod('{f}', 0o444); os.ftruncate(fd, {half}); os.pwrite(fd, b'late', {half}); os.close(fd)\"",
            f = p(name).display(),
            half = size / 2
        );
        step(&format!("ftruncate and write after chmod 444 ({size} bytes)"), Ok(as_nobody(&script).to_string()));
        step(&format!("what they left ({size} bytes)"), o(fs::read(p(name)).map(|b| b[b.len() - 6..].to_vec())));
    }
    // Links.
    step("hard link", o(fs::hard_link(p("t"), p("t2"))));
    step("nlink", o(fs::metadata(p("t")).map(|m| m.nlink())));
    step("link over existing", o(fs::hard_link(p("t"), p("a"))));
    step("symlink", o(std::os::unix::fs::symlink("t", p("s"))));
    step("readlink", o(fs::read_link(p("s"))));
    step("through symlink", o(fs::read(p("s"))));
    step("lstat kind", o(fs::symlink_metadata(p("s")).map(|m| m.file_type().is_symlink())));
    // Renames.
    fs::write(p("r1"), b"one").unwrap();
    fs::write(p("r2"), b"two").unwrap();
    step("rename over file", o(fs::rename(p("r1"), p("r2"))));
    step("renamed content", o(fs::read(p("r2"))));
    step("old name gone", o(fs::metadata(p("r1")).map(|_| ())));
    fs::create_dir(p("d1")).unwrap();
    fs::create_dir(p("d2")).unwrap();
    step("rename dir over empty dir", o(fs::rename(p("d1"), p("d2"))));
    fs::create_dir(p("d3")).unwrap();
    fs::write(p("d2/x"), b"").unwrap();
    step("rename dir over non-empty", o(fs::rename(p("d3"), p("d2"))));
    step("rename file over dir", o(fs::rename(p("r2"), p("d3"))));
    step("rename dir over file", o(fs::rename(p("d3"), p("r2"))));
    step("rename into own child", o(fs::rename(p("d2"), p("d2/x/y"))));
    // Unlink of an open file.
    {
        fs::write(p("open"), b"still here").unwrap();
        let mut f = File::open(p("open")).unwrap();
        step("unlink open", o(fs::remove_file(p("open"))));
        let mut s = String::new();
        step("read after unlink", o(f.read_to_string(&mut s).map(|_| s.clone())));
        step("gone by name", o(fs::metadata(p("open")).map(|_| ())));
    }
    // A write changes mtime and ctime at once, before its bytes are written back (on the
    // MDT, and past its 64 KiB on an OST).
    let times = |m: fs::Metadata| ((m.mtime(), m.mtime_nsec()), (m.ctime(), m.ctime_nsec()));
    for at in [10, 70_000] {
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(p("w")).unwrap();
        let (m0, c0) = times(f.metadata().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(20));
        f.write_all_at(b"x", at).unwrap();
        let changed = f.metadata().map(times).map(|(m, c)| (m != m0, c != c0));
        step(&format!("a write at {at} changes mtime and ctime"), o(changed));
    }
    let c = |path: PathBuf| CString::new(path.into_os_string().into_encoded_bytes()).unwrap();
    // Special files: FIFOs, sockets and device nodes, kept with their type and number.
    let mknod = |n: &str, kind: u32, major: u32, minor: u32| {
        let path = c(p(n));
        // SAFETY: a valid C string.
        let r = unsafe { libc::mknod(path.as_ptr(), kind | 0o640, libc::makedev(major, minor)) };
        if r == 0 { Ok(String::new()) } else { Err(errno(std::io::Error::last_os_error())) }
    };
    step("mkfifo", mknod("fifo", libc::S_IFIFO, 0, 0));
    step("mknod char", mknod("chr", libc::S_IFCHR, 1, 3));
    step("mknod block", mknod("blk", libc::S_IFBLK, 259, 70_000));
    step("mknod existing", mknod("fifo", libc::S_IFIFO, 0, 0));
    let listener = std::os::unix::net::UnixListener::bind(p("sock"));
    step("bind a socket", listener.as_ref().map(|_| String::new()).map_err(|e| e.raw_os_error().unwrap_or(-1)));
    let special = |n: &str| {
        o(fs::symlink_metadata(p(n)).map(|m| {
            let t = m.file_type();
            let kind = [t.is_fifo(), t.is_char_device(), t.is_block_device(), t.is_socket()];
            (kind, m.mode() & 0o7777, libc::major(m.rdev()), libc::minor(m.rdev()), m.len(), m.nlink())
        }))
    };
    for n in ["fifo", "chr", "blk", "sock"] {
        step(&format!("stat {n}"), special(n));
    }
    step(
        "nobody makes a device node",
        Ok(as_nobody(&format!("mknod {} c 1 3 2>/dev/null || exit 1", q("pub/dev"))).to_string()),
    );
    step("nobody makes a FIFO", Ok(as_nobody(&format!("mkfifo {}", q("pub/nfifo"))).to_string()));
    step("nobody's FIFO", special("pub/nfifo"));
    // A FIFO and a socket carry bytes between processes of this machine.
    let writer = Command::new("sh").arg("-c").arg(format!("echo through the fifo > {}", q("fifo"))).spawn().unwrap();
    step("read a FIFO", o(fs::read_to_string(p("fifo"))));
    let _ = { writer }.wait();
    if let Ok(l) = &listener {
        let path = p("sock");
        let client = std::thread::spawn(move || {
            let mut s = std::os::unix::net::UnixStream::connect(path)?;
            s.write_all(b"through the socket")
        });
        let mut got = String::new();
        step("read a socket", o(l.accept().and_then(|(mut s, _)| s.read_to_string(&mut got)).map(|_| got.clone())));
        step("socket client", o(client.join().unwrap()));
    }
    drop(listener);
    step("rename a FIFO", o(fs::rename(p("fifo"), p("fifo2"))));
    step("link a device node", o(fs::hard_link(p("chr"), p("chr2"))));
    step("linked device node", special("chr2"));
    step("chmod a socket", o(fs::set_permissions(p("sock"), fs::Permissions::from_mode(0o600))));
    step("chmod'ed socket", special("sock"));
    step("chown a block device", o(std::os::unix::fs::lchown(p("blk"), Some(65534), Some(65534))));
    step("owner of the block device", o(fs::symlink_metadata(p("blk")).map(|m| (m.uid(), m.gid()))));
    let (dev, user) = (c(p("chr")), CString::new("user.x").unwrap());
    // SAFETY: valid C strings and buffer.
    let on_dev = unsafe { libc::setxattr(dev.as_ptr(), user.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    let e = errno(std::io::Error::last_os_error()) * i32::from(on_dev != 0);
    step("user xattr on a device node", Ok(format!("{on_dev} {e}")));
    for n in ["fifo2", "chr", "chr2", "blk", "sock", "pub/nfifo"] {
        step(&format!("unlink {n}"), o(fs::remove_file(p(n))));
    }
    // Directories and errors.
    step("rmdir non-empty", o(fs::remove_dir(p("d2"))));
    step("unlink dir", o(fs::remove_file(p("d2"))));
    step("open dir for write", o(OpenOptions::new().write(true).open(p("d2")).map(|_| ())));
    step("mkdir existing", o(fs::create_dir(p("d2"))));
    step("through a file", o(fs::metadata(p("t/x")).map(|_| ())));
    step("missing parent", o(File::create(p("nope/x")).map(|_| ())));
    step("name too long", o(File::create(p(&"n".repeat(256))).map(|_| ())));
    step("255 bytes fine", o(File::create(p(&"n".repeat(255))).map(|_| ())));
    // xattrs.
    let (f, name) = (c(p("t")), CString::new("user.color").unwrap());
    // SAFETY: valid C strings and buffers.
    let set = unsafe { libc::setxattr(f.as_ptr(), name.as_ptr(), b"blue".as_ptr().cast(), 4, 0) };
    step("setxattr", Ok(format!("{set}")));
    let mut buf = [0u8; 16];
    let n = unsafe { libc::getxattr(f.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    step("getxattr", Ok(String::from_utf8_lossy(&buf[..n.max(0) as usize]).into_owned()));
    let create = unsafe { libc::setxattr(f.as_ptr(), name.as_ptr(), b"red".as_ptr().cast(), 3, libc::XATTR_CREATE) };
    step(
        "xattr create on existing",
        Ok(format!(
            "{create} {}",
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0) * i32::from(create != 0)
        )),
    );
    let rm = unsafe { libc::removexattr(f.as_ptr(), name.as_ptr()) };
    step("removexattr", Ok(format!("{rm}")));
    let gone = unsafe { libc::getxattr(f.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    step("getxattr removed", Ok(format!("{gone} {}", std::io::Error::last_os_error().raw_os_error().unwrap_or(0))));
    // POSIX ACLs, through setfacl and getfacl (numeric ids, no header).
    let sh = |script: &str| -> Outcome {
        let out = Command::new("sh").arg("-c").arg(script).current_dir(root).output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        Ok(format!("{} {stdout}{}", out.status.code().unwrap_or(-1), stderr.lines().count()))
    };
    let get = "getfacl -n --omit-header";
    fs::write(p("acl"), b"acl\n").unwrap();
    fs::set_permissions(p("acl"), fs::Permissions::from_mode(0o644)).unwrap();
    step("setfacl -m", sh(&format!("setfacl -m u:65534:rw,g:65534:r acl && stat -c %a acl && {get} acl")));
    let append = |n: &str| format!("echo n >> {} 2>/dev/null || exit 13", q(n));
    step("nobody writes by the ACL", Ok(as_nobody(&append("acl")).to_string()));
    step("chmod sets the mask", sh(&format!("chmod 640 acl && {get} acl")));
    step("nobody writes past the mask", Ok(as_nobody(&append("acl")).to_string()));
    step("ls shows an ACL", sh("ls -l acl | cut -c1-11"));
    step("setfacl -b", sh(&format!("setfacl -b acl && stat -c %a acl && {get} acl && ls -l acl | cut -c1-11")));
    step("a default ACL on a file", sh("setfacl -d -m u:65534:rwx acl"));
    fs::create_dir(p("dacl")).unwrap();
    step("setfacl -d", sh(&format!("setfacl -d -m u:65534:rwx,g::rx,o::- dacl && {get} dacl")));
    step("a file inherits", sh(&format!("umask 077 && touch dacl/f && stat -c %a dacl/f && {get} dacl/f")));
    step("a directory inherits", sh(&format!("umask 077 && mkdir dacl/d && stat -c %a dacl/d && {get} dacl/d")));
    step("nobody writes by the inherited ACL", Ok(as_nobody(&append("dacl/f")).to_string()));
    step("the umask without a default ACL", sh("umask 027 && touch plain && mkdir plaind && stat -c %a plain plaind"));
    // Listing.
    let mut names: Vec<String> =
        fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    step("readdir", Ok(names.join(",")));
    out
}

#[test]
fn posix_calls_through_the_mount_do_what_linux_does() {
    let fs = Up::start("posix");
    let local = scratch("posix-local");
    let want = posix_suite(&local);
    let nacre_root = fs.mnt.join("suite");
    fs::create_dir(&nacre_root).unwrap();
    let got = posix_suite(&nacre_root);
    let mut diffs = Vec::new();
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        if w != g {
            diffs.push(format!("{name}: local {w:?}, nacre {g:?}"));
        }
    }
    assert!(diffs.is_empty(), "differences from the local file system:\n{}", diffs.join("\n"));
    assert_eq!(want.len(), got.len());
    // statfs sums the targets.
    let out = Command::new("df").arg("-B1").arg(&fs.mnt).output().unwrap();
    assert!(out.status.success());
    let _ = fs::remove_dir_all(&local);
}

/// pjdfstest, the POSIX conformance suite file systems run in CI (its Rust version,
/// which `scripts/test` installs into `target/tools`; `NACRE_PJDFSTEST` names another).
fn pjdfstest() -> PathBuf {
    let path = std::env::var_os("NACRE_PJDFSTEST")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/bin/pjdfstest"));
    assert!(
        path.exists(),
        "{} is missing: scripts/test installs it (cargo install pjdfstest --version 0.2.2 --locked --root \
         target/tools)",
        path.display()
    );
    path
}

/// Each test pjdfstest ran in `dir`, with its outcome (`ok`, `FAILED` or `skipped`).
fn run_pjdfstest(dir: &Path, config: &Path) -> BTreeMap<String, String> {
    let out = Command::new(pjdfstest()).arg("-c").arg(config).arg("-p").arg(dir).current_dir(dir).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut outcomes = BTreeMap::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if let (Some(name), Some(outcome), None) = (words.next(), words.next(), words.next())
            && name.contains("::")
            && ["ok", "FAILED", "skipped"].contains(&outcome)
        {
            outcomes.insert(name.to_string(), outcome.to_string());
        }
    }
    assert!(outcomes.len() > 300, "pjdfstest in {} ran {} tests:\n{text}", dir.display(), outcomes.len());
    outcomes
}

#[test]
fn the_posix_conformance_suite_passes_through_the_mount_as_on_the_local_file_system() {
    let fs = Up::start("pjdfstest");
    let root = fs.data.parent().unwrap().to_path_buf();
    // Two users besides root for its permission tests, and a nap longer than the local
    // file system's timestamp granularity (the kernel's clock tick).
    let config = root.join("pjdfstest.toml");
    fs::write(
        &config,
        "[features]\nposix_fallocate = {}\nrename_ctime = {}\nutime_now = {}\nutimensat = {}\n\
         [settings]\nnaptime = 0.05\nallow_remount = false\n\
         [dummy_auth]\nentries = [[\"nobody\", \"nogroup\"], [\"daemon\", \"daemon\"]]\n",
    )
    .unwrap();
    let (local, mounted) = (root.join("local"), fs.mnt.join("suite"));
    fs::create_dir(&local).unwrap();
    fs::create_dir(&mounted).unwrap();
    let want = run_pjdfstest(&local, &config);
    let mut got = run_pjdfstest(&mounted, &config);
    // glibc's pathconf knows no LINK_MAX for FUSE file systems, so the suite skips its
    // link-count test there (the MDT's EMLINK has a test of its own).
    let unknowable = ["link::link_count_max"];
    let missed = |got: &BTreeMap<String, String>| -> Vec<String> {
        want.iter()
            .filter(|(name, w)| *w == "ok" && got.get(*name) != Some(w) && !unknowable.contains(&name.as_str()))
            .map(|(name, _)| name.clone())
            .collect()
    };
    // A test that failed is run again alone, once, and must pass then: a few of the
    // suite's tests race the machine (ETXTBSY while another process of this busy test
    // run holds the new executable open; timestamps a nap apart). Each is named.
    for name in missed(&got) {
        let out = Command::new(pjdfstest())
            .args(["-c"])
            .arg(&config)
            .arg("-p")
            .arg(&mounted)
            .arg(&name)
            .current_dir(&mounted)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let again = text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == [name.as_str(), "ok"]);
        eprintln!(
            "pjdfstest {name} through the mount: {}, then {}",
            got[&name],
            if again { "ok" } else { "failed again" }
        );
        if again {
            got.insert(name, "ok".into());
        }
    }
    let differ: Vec<String> = missed(&got)
        .into_iter()
        .map(|name| format!("{name}: {} through the mount", got.get(&name).map_or("not run", |g| g.as_str())))
        .collect();
    assert!(differ.is_empty(), "passed on the local file system, not through the mount:\n{}", differ.join("\n"));
}

/// A seeded random-operation run after fsx: writes, reads, truncates and mmap reads of
/// one file through the mount, each checked against a model of the file. 6,000
/// operations by default, a new seed each run (a truncate or an fsync waits for the OSTs'
/// commit, and one op in five is one of them: 84 s of CI's run for 30,000, and the
/// longest test of a slow day's run at 15,000); `NACRE_FSX_OPS` sets more for a long run,
/// as many as xfstests' fsx runs do.
#[test]
fn random_operations_match_a_model_file() {
    let fs = Up::start("fsx");
    let seed = common::seed("fsx");
    let ops: u64 = std::env::var("NACRE_FSX_OPS").ok().and_then(|s| s.parse().ok()).unwrap_or(6_000);
    let path = fs.mnt.join("fsx.bin");
    // A layout striped over both OSTs in 64 KiB stripes, so operations cross objects.
    let out = nacre().args(["setstripe", "-c", "2", "-S", "64K"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "setstripe: {}", String::from_utf8_lossy(&out.stderr));
    let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let mut model: Vec<u8> = Vec::new();
    let mut x = seed | 1;
    let mut rnd = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    };
    const MAX: u64 = 1 << 20;
    for op in 0..ops {
        match rnd(10) {
            0..=3 => {
                let off = rnd(MAX);
                let big = rnd(4) == 0;
                let len = 1 + rnd(if big { 65_536 } else { 4096 });
                let fill = (op % 251) as u8 + 1;
                let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                f.write_all_at(&data, off).unwrap();
                let end = (off + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
            }
            4..=7 => {
                let off = rnd(MAX);
                let len = 1 + rnd(65_536);
                let mut buf = vec![0u8; len as usize];
                let mut got = 0;
                while got < buf.len() {
                    let n = f.read_at(&mut buf[got..], off + got as u64).unwrap();
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                let want = model.get(off as usize..(off as usize + len as usize).min(model.len())).unwrap_or(&[]);
                assert_eq!(&buf[..got], want, "op {op}: read {len} at {off} (seed {seed})");
            }
            8 => {
                let size = rnd(MAX);
                f.set_len(size).unwrap();
                model.resize(size as usize, 0);
            }
            _ => {
                // mmap reads see what was written.
                let len = model.len();
                if len == 0 {
                    continue;
                }
                f.sync_all().unwrap();
                use std::os::fd::AsRawFd;
                // SAFETY: a private read-only map of `len` bytes of an open file, unmapped below.
                let p = unsafe {
                    libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0)
                };
                assert_ne!(p, libc::MAP_FAILED, "op {op}: mmap failed");
                let view = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
                let at = rnd(len as u64) as usize;
                let n = (rnd(8192) as usize).min(len - at);
                assert_eq!(&view[at..at + n], &model[at..at + n], "op {op}: mmap read at {at} (seed {seed})");
                unsafe { libc::munmap(p, len) };
            }
        }
        if op % 5000 == 0 {
            assert_eq!(f.metadata().unwrap().len(), model.len() as u64, "op {op}: size (seed {seed})");
        }
    }
    drop(f);
    assert_eq!(fs::read(&path).unwrap(), model, "the whole file after {ops} operations (seed {seed})");
}

#[test]
fn two_mounts_write_disjoint_ranges_of_one_file_and_read_each_other() {
    let fs = Up::start("two");
    let second = fs.mnt.parent().unwrap().join("mnt2");
    fs::create_dir_all(&second).unwrap();
    let out = nacre().args(["mount", "--mgs", &fs.mgs()]).arg(&second).output().unwrap();
    assert!(out.status.success(), "nacre mount: {}", String::from_utf8_lossy(&out.stderr));
    let (a, b) = (fs.mnt.join("shared"), second.join("shared"));
    let out = nacre().args(["setstripe", "-c", "2", "-S", "64K"]).arg(&a).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let block = 300_000usize;
    let fa = OpenOptions::new().write(true).open(&a).unwrap();
    let fb = OpenOptions::new().write(true).open(&b).unwrap();
    let pattern = |i: usize| vec![(i * 37 % 251) as u8 + 1; block];
    for i in 0..8 {
        let (f, off) = if i % 2 == 0 { (&fa, i * block) } else { (&fb, i * block) };
        f.write_all_at(&pattern(i), off as u64).unwrap();
    }
    fa.sync_all().unwrap();
    fb.sync_all().unwrap();
    drop((fa, fb));
    let want: Vec<u8> = (0..8).flat_map(pattern).collect();
    assert!(fs::read(&a).unwrap() == want, "the first mount reads both mounts' bytes");
    assert!(fs::read(&b).unwrap() == want, "the second mount reads both mounts' bytes");
    // A missing name is a negative entry the kernel keeps for the attribute timeout
    // (1 s): a thousand stats of it ask the MDS about once; this mount's own create
    // replaces it at once, and the other mount sees the file within the timeout.
    let (x, y) = (fs.mnt.join("later"), second.join("later"));
    let lookups = || fs.mds_ops("lookup");
    assert_eq!(fs::metadata(&y).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    let before = lookups();
    let started = std::time::Instant::now();
    for _ in 0..1000 {
        assert_eq!(fs::metadata(&y).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    }
    if started.elapsed() < std::time::Duration::from_millis(900) {
        assert_eq!(lookups(), before, "the misses were answered by the kernel");
    }
    fs::write(&y, b"made here").unwrap();
    assert_eq!(fs::read(&y).unwrap(), b"made here", "this mount's create replaced its negative entry");
    fs::remove_file(&x).unwrap();
    let gone = std::time::Instant::now();
    while fs::metadata(&y).is_ok() {
        assert!(gone.elapsed() < std::time::Duration::from_secs(3), "the other mount's unlink never showed");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The kernel drops a directory's attributes at each create and unlink in it, and asks
    // for them before the next (its permission check): the create-open's and the
    // unlink's replies bring them, so fifty of each send the MDS no getattr.
    let churn = fs.mnt.join("churn");
    fs::create_dir(&churn).unwrap();
    let getattrs = || fs.mds_ops("getattr");
    let before = getattrs();
    for i in 0..50 {
        File::create(churn.join(format!("f{i}"))).unwrap();
    }
    for i in 0..50 {
        fs::remove_file(churn.join(format!("f{i}"))).unwrap();
    }
    assert!(getattrs() - before <= 2, "{} getattrs for 50 creates and unlinks", getattrs() - before);
    // The kernel asks for security.capability before each write(2): a file made here
    // has none, and a miss is remembered, so fifty writes ask the MDS nothing.
    let getxattrs = || fs.mds_ops("getxattr");
    let before = getxattrs();
    let mut f = File::create(fs.mnt.join("caps")).unwrap();
    for _ in 0..50 {
        f.write_all(b"0123456789").unwrap();
    }
    drop(f);
    assert_eq!(getxattrs(), before, "no getxattr for the writes");
    // A miss remembered, then a set on this mount: shown at once.
    let p = CString::new(fs.mnt.join("caps").into_os_string().into_encoded_bytes()).unwrap();
    let k = CString::new("user.k").unwrap();
    let mut buf = [0u8; 16];
    let get = |buf: &mut [u8]| {
        // SAFETY: valid C strings and buffer.
        unsafe { libc::getxattr(p.as_ptr(), k.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) }
    };
    assert_eq!(get(&mut buf), -1);
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENODATA));
    // SAFETY: valid C strings and value.
    let set = unsafe { libc::setxattr(p.as_ptr(), k.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(get(&mut buf), 1);
    assert_eq!(&buf[..1], b"v");
    let out = nacre().arg("umount").arg(&second).output().unwrap();
    assert!(out.status.success(), "nacre umount: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn up_after_the_server_was_killed_finds_all_the_data() {
    let fs = Up::start("kill");
    let mut files = Vec::new();
    for (i, size) in [0usize, 1, 4096, 100_000, 3 << 20].into_iter().enumerate() {
        let data: Vec<u8> = (0..size).map(|k| (k * 7 + i) as u8).collect();
        let p = fs.mnt.join(format!("f{i}"));
        let mut f = File::create(&p).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        files.push((format!("f{i}"), data));
    }
    fs::create_dir(fs.mnt.join("dir")).unwrap();
    std::os::unix::fs::symlink("f1", fs.mnt.join("link")).unwrap();
    // The MDT answers before its commit and the mount dies with it: what POSIX promises
    // is what an fsync made durable, here of the directory holding the two new names.
    File::open(&fs.mnt).unwrap().sync_all().unwrap();
    // A second up on a running folder refuses, and says why.
    let again = nacre().args(["up", "--port"]).arg(fs.port.to_string()).arg("--data").arg(&fs.data).output().unwrap();
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already up"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    // SIGKILL: no clean stop.
    // SAFETY: kill(2) of the serving process we started.
    unsafe { libc::kill(fs.pid(), libc::SIGKILL) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    fs.up();
    for (name, data) in &files {
        assert!(fs::read(fs.mnt.join(name)).unwrap() == *data, "{name} after the kill");
    }
    assert!(fs.mnt.join("dir").is_dir());
    assert_eq!(fs::read_link(fs.mnt.join("link")).unwrap(), Path::new("f1"));
    // And a clean stop and start.
    fs.down();
    assert!(!common_is_mounted(&fs.mnt), "down leaves no mount");
    fs.up();
    assert!(fs::read(fs.mnt.join("f4")).unwrap() == files[4].1);
}

/// A second mount of `fs` on `dir`, by `nacre mount`; returns the PID of its process.
fn second_mount(fs: &Up, dir: &Path) -> i32 {
    fs::create_dir_all(dir).unwrap();
    let out = nacre().args(["mount", "--mgs", &fs.mgs()]).arg(dir).output().unwrap();
    assert!(out.status.success(), "nacre mount: {}", String::from_utf8_lossy(&out.stderr));
    // The serving process: the one whose command line names the mount point.
    let want = dir.as_os_str().as_encoded_bytes();
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmd.split(|b| *b == 0).any(|a| a == want) && cmd.windows(8).any(|w| w == b"--detach")
        })
        .expect("the second mount's process")
}

/// A process taking `fcntl` and `flock` locks as told, one command a line
/// (`CMD PATH START LEN`), answering each: `ok`, `err ERRNO`, or for a test (`t`) the
/// lock in the way (`lock TYPE START LEN PID`) or `none`. Commands: `r`/`w`/`u` read,
/// write, unlock (F_SETLK), `W` write waiting (F_SETLKW), `t` test for a write lock,
/// `x`/`s` flock exclusive/shared without waiting, `X` flock exclusive waiting, `U`
/// flock unlock.
struct Locker {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

const LOCKER: &str = r#"
import fcntl, os, struct, sys
fds = {}
def fd(p):
    if p not in fds: fds[p] = os.open(p, os.O_RDWR)
    return fds[p]
for line in sys.stdin:
    c, p, s, n = line.split()
    s, n = int(s), int(n)
    try:
        if c == 't':
            r = fcntl.fcntl(fd(p), fcntl.F_GETLK, struct.pack('hhqqi', fcntl.F_WRLCK, 0, s, n, 0))
            t, _, s2, n2, pid = struct.unpack('hhqqi', r)
            print('none' if t == fcntl.F_UNLCK else f'lock {t} {s2} {n2} {pid}', flush=True)
            continue
        if c in 'xsXU':
            op = {'x': fcntl.LOCK_EX | fcntl.LOCK_NB, 's': fcntl.LOCK_SH | fcntl.LOCK_NB, 'X': fcntl.LOCK_EX, 'U': fcntl.LOCK_UN}[c]
            fcntl.flock(fd(p), op)
        else:
            kind = {'r': fcntl.F_RDLCK, 'w': fcntl.F_WRLCK, 'u': fcntl.F_UNLCK, 'W': fcntl.F_WRLCK}[c]
            cmd = fcntl.F_SETLKW if c == 'W' else fcntl.F_SETLK
            fcntl.fcntl(fd(p), cmd, struct.pack('hhqqi', kind, 0, s, n, 0))
        print('ok', flush=True)
    except OSError as e:
        print('err', e.errno, flush=True)
"#;

impl Locker {
    fn start() -> Locker {
        let mut child = Command::new("python3")
            .args(["-c", LOCKER])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        Locker { child, out }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send a command without waiting for its answer (one that waits for a lock).
    fn send(&mut self, cmd: &str, path: &Path, start: u64, len: u64) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{cmd} {} {start} {len}", path.display()).unwrap();
        stdin.flush().unwrap();
    }

    fn answer(&mut self) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    fn ask(&mut self, cmd: &str, path: &Path, start: u64, len: u64) -> String {
        self.send(cmd, path, start, len);
        self.answer()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Locker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `fcntl` and `flock` locks hold between two mounts: shared and exclusive, split and
/// upgraded ranges, a test showing the lock in the way, waits woken when it goes, a
/// deadlock across mounts refused, the locks of a killed process released by its exit,
/// and those of a killed mount released when the MDS evicts it.
#[test]
fn locks_hold_between_mounts_and_go_with_their_holder() {
    let fs = Up::start("locks");
    let second = fs.mnt.parent().unwrap().join("mnt2");
    let second_pid = second_mount(&fs, &second);
    for n in ["f", "g"] {
        fs::write(fs.mnt.join(n), b"0123456789").unwrap();
    }
    let (f1, f2, g1, g2) = (fs.mnt.join("f"), second.join("f"), fs.mnt.join("g"), second.join("g"));
    let (mut a, mut b, mut c) = (Locker::start(), Locker::start(), Locker::start());
    // Shared between mounts, exclusive against them; an upgrade waits for the other reader.
    assert_eq!(a.ask("r", &f1, 0, 100), "ok");
    assert_eq!(b.ask("w", &f2, 50, 10), "err 11");
    assert_eq!(b.ask("r", &f2, 50, 10), "ok");
    assert_eq!(a.ask("w", &f1, 40, 30), "err 11");
    assert_eq!(b.ask("u", &f2, 50, 10), "ok");
    assert_eq!(a.ask("w", &f1, 40, 30), "ok");
    // The other mount sees the write lock in the middle of the reads, with its pid.
    assert_eq!(b.ask("t", &f2, 40, 30), format!("lock 1 40 30 {}", a.pid()));
    assert_eq!(b.ask("t", &f2, 100, 50), "none");
    // Unlocking part of it splits it: the middle is free, its sides are not.
    assert_eq!(a.ask("u", &f1, 50, 10), "ok");
    assert_eq!(b.ask("w", &f2, 50, 10), "ok");
    assert_eq!(c.ask("w", &f1, 45, 1), "err 11", "another process of the first mount");
    // A wait is woken when the lock goes.
    c.send("W", &f1, 45, 1);
    assert_eq!(a.ask("u", &f1, 0, 0), "ok");
    assert_eq!(c.answer(), "ok");
    assert_eq!(c.ask("u", &f1, 0, 0), "ok");
    assert_eq!(b.ask("u", &f2, 0, 0), "ok");
    // A deadlock across mounts: a waits for b, so b waiting for a is refused.
    assert_eq!(a.ask("w", &g1, 0, 1), "ok");
    assert_eq!(b.ask("w", &f2, 200, 1), "ok");
    a.send("W", &f1, 200, 1);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(b.ask("W", &g2, 0, 1), "err 35");
    assert_eq!(b.ask("u", &f2, 200, 1), "ok");
    assert_eq!(a.answer(), "ok");
    assert_eq!(a.ask("u", &f1, 0, 0), "ok");
    assert_eq!(a.ask("u", &g1, 0, 0), "ok");
    // flock: exclusive between mounts, shared together, a waiter woken by the unlock.
    assert_eq!(a.ask("x", &f1, 0, 0), "ok");
    assert_eq!(b.ask("x", &f2, 0, 0), "err 11");
    assert_eq!(b.ask("s", &f2, 0, 0), "err 11");
    b.send("X", &f2, 0, 0);
    assert_eq!(a.ask("U", &f1, 0, 0), "ok");
    assert_eq!(b.answer(), "ok");
    assert_eq!(a.ask("s", &f1, 0, 0), "err 11");
    assert_eq!(b.ask("U", &f2, 0, 0), "ok");
    assert_eq!(a.ask("s", &f1, 0, 0), "ok");
    assert_eq!(c.ask("s", &f1, 0, 0), "ok");
    assert_eq!(a.ask("U", &f1, 0, 0), "ok");
    assert_eq!(c.ask("U", &f1, 0, 0), "ok");
    // A killed process's locks go with it (its exit closes the file).
    assert_eq!(b.ask("w", &f2, 300, 1), "ok");
    assert_eq!(a.ask("w", &f1, 300, 1), "err 11");
    b.kill();
    assert_eq!(a.ask("W", &f1, 300, 1), "ok");
    assert_eq!(a.ask("u", &f1, 0, 0), "ok");
    // A killed mount's locks stay until the MDS evicts its client.
    let mut d = Locker::start();
    assert_eq!(d.ask("w", &f2, 500, 1), "ok");
    // What the first mount's processes let go of under its lease the MDS may still
    // hold for them: another mount's test of the whole file calls it back.
    assert_eq!(d.ask("t", &f2, 0, 0), "none");
    let mgs = fs.mgs();
    assert_eq!(figure(&mds_param(&mgs, "mdt.*.locks"), "held"), 1);
    // SAFETY: a signal to the second mount's process, found by its command line.
    assert_eq!(unsafe { libc::kill(second_pid, libc::SIGKILL) }, 0);
    d.kill();
    assert_eq!(a.ask("w", &f1, 500, 1), "err 11");
    // `mdt.*.exports`: a line per client, its id first.
    let exports = mds_param(&mgs, "mdt.*.exports");
    let dead = exports
        .lines()
        .find(|l| l.contains("locks=1"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("the killed mount's client holding one lock: {exports}"));
    mds_param(&mgs, &format!("mdt.mdt0.evict_client={dead}"));
    assert_eq!(a.ask("w", &f1, 500, 1), "ok");
    let locks = mds_param(&mgs, "mdt.*.locks");
    assert!(figure(&locks, "deadlocks") == 1 && figure(&locks, "evicted") == 1, "{locks}");
    let _ = Command::new("umount").arg("-l").arg(&second).status();
}

/// Processes of two mounts appending records to one file with O_APPEND: every record
/// whole, none lost, each writer's in its order.
#[test]
fn appends_from_two_mounts_never_overlap() {
    let fs = Up::start("appends");
    let second = fs.mnt.parent().unwrap().join("mnt2");
    second_mount(&fs, &second);
    const APPENDER: &str = r#"
import os, sys, time
path, tag, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
n, end = 0, time.time() + secs
while time.time() < end:
    os.write(fd, f"{tag} {n:08d} ".encode() + b"x" * (40 + n % 4000) + b"\n")
    n += 1
os.close(fd)
print(n)
"#;
    let writers: Vec<(String, std::process::Child)> = (0..4)
        .map(|i| {
            let (mnt, tag) = if i % 2 == 0 { (&fs.mnt, format!("a{i}")) } else { (&second, format!("b{i}")) };
            let child = Command::new("python3")
                .args(["-c", APPENDER])
                .arg(mnt.join("log"))
                .args([&tag, "2"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            (tag, child)
        })
        .collect();
    let mut want = std::collections::BTreeMap::new();
    for (tag, child) in writers {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        want.insert(tag, String::from_utf8_lossy(&out.stdout).trim().parse::<usize>().unwrap());
    }
    let data = fs::read(fs.mnt.join("log")).unwrap();
    assert_eq!(data.last(), Some(&b'\n'), "the file ends with a whole record");
    let mut got: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for record in data[..data.len() - 1].split(|b| *b == b'\n') {
        let text = String::from_utf8_lossy(record);
        let mut words = text.split(' ');
        let (tag, n, body) = (words.next().unwrap(), words.next().unwrap_or(""), words.next().unwrap_or(""));
        let n: usize = n.parse().unwrap_or_else(|_| panic!("a torn record: {text:?}"));
        assert_eq!(body.len(), 40 + n % 4000, "record {n} of {tag} whole");
        assert!(body.bytes().all(|b| b == b'x') && words.next().is_none(), "a torn record: {text:?}");
        let next = got.entry(tag.to_string()).or_default();
        assert_eq!(*next, n, "{tag}'s records in order, none lost");
        *next += 1;
    }
    assert_eq!(got, want, "every record of every writer");
    // A lone appender keeps the append lock: 200 appends cost one lock request, not 400.
    // Another mount's append calls it back and lands after them; then the first's
    // appends go after that one.
    mds_param(&fs.mgs(), "mdt.mdt0.lease_contended_ms=0");
    let append = |path: &Path, records: &[&str]| {
        let mut f = OpenOptions::new().append(true).create(true).open(path).unwrap();
        for r in records {
            f.write_all(r.as_bytes()).unwrap();
        }
    };
    let locks = fs.mds_ops("lock");
    let lone: Vec<String> = (0..200).map(|i| format!("lone {i:03}\n")).collect();
    let lone: Vec<&str> = lone.iter().map(String::as_str).collect();
    let path = fs.mnt.join("lone");
    let writer = std::thread::scope(|sc| {
        let (tx, rx) = std::sync::mpsc::channel();
        let w = sc.spawn(move || {
            let mut f = OpenOptions::new().append(true).create(true).open(path).unwrap();
            for r in &lone {
                f.write_all(r.as_bytes()).unwrap();
            }
            tx.send(()).unwrap();
            // Still open (the lock kept) while the other mount appends.
            std::thread::sleep(std::time::Duration::from_millis(300));
            f.write_all(b"after\n").unwrap();
        });
        rx.recv().unwrap();
        let kept = fs.mds_ops("lock") - locks;
        append(&second.join("lone"), &["other\n"]);
        w.join().unwrap();
        kept
    });
    assert!(writer <= 2, "200 lone appends took {writer} lock requests");
    let text = fs::read_to_string(fs.mnt.join("lone")).unwrap();
    let mut want: String = (0..200).map(|i| format!("lone {i:03}\n")).collect();
    want.push_str("other\nafter\n");
    assert_eq!(text, want, "the other mount's append after the kept ones, the next after it");
    let _ = Command::new("umount").arg("-l").arg(&second).status();
}

/// A file system with a second mount, both taking leases even on what was just changed
/// (so each step of a test runs under one): the file system, its MGS, the second mount's
/// folder and the process serving it.
fn leased_pair(name: &str) -> (Up, String, PathBuf, i32) {
    let fs = Up::start(name);
    let mgs = fs.mgs();
    mds_param(&mgs, "mdt.mdt0.lease_contended_ms=0");
    let second = fs.mnt.parent().unwrap().join("mnt2");
    let pid = second_mount(&fs, &second);
    (fs, mgs, second, pid)
}

/// Read requests the OSTs served, over every OST of the file system.
fn ost_reads(mgs: &str) -> u64 {
    let get = |server: &str, p: &str| {
        let out = nacre().args(["get-param", "--server", server, p]).output().unwrap();
        assert!(out.status.success(), "get-param {p}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let targets = get(mgs, "mgs.*.targets");
    let osts: Vec<String> = targets
        .lines()
        .filter(|l| l.starts_with("nacre-OST"))
        .map(|l| l.split_whitespace().nth(1).unwrap().split(',').next().unwrap().to_string())
        .collect();
    assert!(!osts.is_empty(), "no OST in {targets}");
    osts.iter().map(|nid| figure(&get(nid, "obdfilter.*.stats"), "read_samples")).sum()
}

/// A file read again, unchanged, is read from the kernel's pages: the open keeps them
/// (FOPEN_KEEP_CACHE) while the mount holds a lease on the file's attributes, and a file
/// this mount wrote is read from the pages it was written through. A change from another
/// mount revokes the lease, and the next open drops the pages: the new bytes are read,
/// never the old.
#[test]
fn an_unchanged_file_is_read_again_from_the_kernels_pages_until_another_mount_changes_it() {
    let (fs, mgs, second, _) = leased_pair("kept-pages");
    let (a, b) = (fs.mnt.join("f"), second.join("f"));
    // Past the first 64 KiB (on the MDT): on the OSTs.
    let mut data: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 + i / 4093) as u8).collect();
    let (before, closes) = (ost_reads(&mgs), fs.mds_ops("close"));
    fs::write(&a, &data).unwrap();
    // The kernel releases a file after close(2) returns: its last close vouches for the
    // pages once the mount has served that release.
    let t = std::time::Instant::now();
    while fs.mds_ops("close") == closes {
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "the written file was never released");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(fs::read(&a).unwrap() == data, "the first mount read other bytes");
    assert_eq!(
        ost_reads(&mgs),
        before,
        "a file written here was read from the OSTs, not the pages it was written through"
    );
    // Changed by the second mount, it is read anew (below, the other way round).
    {
        let mut f = fs::OpenOptions::new().write(true).open(&b).unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(b"changed by the second mount").unwrap();
    }
    data[1 << 20..(1 << 20) + 27].copy_from_slice(b"changed by the second mount");
    assert!(fs::read(&a).unwrap() == data, "the first mount kept its old pages after the second changed the file");
    // The first read fetches the bytes and makes the lease and the pages' entry; the
    // next opens keep the pages.
    assert!(fs::read(&b).unwrap() == data, "the second mount read other bytes");
    let before = ost_reads(&mgs);
    for _ in 0..3 {
        assert!(fs::read(&b).unwrap() == data, "the second mount read other bytes from its pages");
    }
    assert_eq!(ost_reads(&mgs), before, "an unchanged file was read from the OSTs again");
    // The first mount changes bytes in the middle (same size): the second reads them.
    {
        let mut f = fs::OpenOptions::new().write(true).open(&a).unwrap();
        f.seek(SeekFrom::Start(3 << 20)).unwrap();
        f.write_all(b"changed by the first mount").unwrap();
    }
    data[3 << 20..(3 << 20) + 26].copy_from_slice(b"changed by the first mount");
    assert!(fs::read(&b).unwrap() == data, "the second mount kept its old pages after a change");
    assert!(ost_reads(&mgs) > before, "the changed file was not read from the OSTs");
    let _ = Command::new("umount").arg("-l").arg(&second).status();
}

/// A small file this mount wrote, or read whole, opens again for reading with no request
/// to the MDS while the mount holds its lease (its bytes are here). It reads as written;
/// read through such an open after another mount unlinked it, it still reads as it was; a
/// lock taken through it holds against the other mount; and a change from either mount
/// is read at the next open.
#[test]
fn a_small_file_this_mount_knows_whole_opens_with_no_request_until_it_changes() {
    let (fs, _mgs, second, _) = leased_pair("whole");
    let (a, b) = (|n: &str| fs.mnt.join(n), |n: &str| second.join(n));
    let data: Vec<u8> = (0..3901u32).map(|i| (i * 31 + i / 251) as u8).collect();
    // The kernel releases a file after close(2) returns: the file is known whole (and
    // leased to others) once the mount has served that release.
    let write = |p: &Path, data: &[u8]| {
        let closes = fs.mds_ops("close");
        fs::write(p, data).unwrap();
        let t = std::time::Instant::now();
        while fs.mds_ops("close") == closes {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "the written file was never released");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    write(&a("f"), &data);
    let asked = || fs.mds_ops("open") + fs.mds_ops("open_at") + fs.mds_ops("close") + fs.mds_ops("dom_read");
    let before = asked();
    for _ in 0..3 {
        assert!(fs::read(a("f")).unwrap() == data, "the first mount read other bytes");
    }
    assert_eq!(asked(), before, "opens of a small file written here asked the MDS");

    // Open here, then unlinked by the other mount: it reads as it was to the end.
    let mut open = File::open(a("f")).unwrap();
    fs::remove_file(b("f")).unwrap();
    let mut got = Vec::new();
    open.read_to_end(&mut got).unwrap();
    assert!(got == data, "a file open here and unlinked elsewhere read other bytes");
    let m = open.metadata().unwrap();
    assert_eq!((m.len(), m.nlink()), (3901, 0), "fstat of a file open here and unlinked elsewhere");
    drop(open);
    assert_eq!(fs::metadata(a("f")).map_err(|e| e.raw_os_error()).err(), Some(Some(libc::ENOENT)));

    // Read whole by the second mount: its next opens ask nothing either; a lock taken
    // through such an open holds against the first mount until it closes.
    write(&a("g"), &data);
    assert!(fs::read(b("g")).unwrap() == data, "the second mount read other bytes");
    let before = asked();
    assert!(fs::read(b("g")).unwrap() == data);
    assert_eq!(asked(), before, "the second open of a file read whole asked the MDS");
    let flock = |f: &File, how: i32| {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this test owns.
        if unsafe { libc::flock(f.as_raw_fd(), how) } == 0 {
            Ok(())
        } else {
            Err(errno(std::io::Error::last_os_error()))
        }
    };
    let held = File::open(b("g")).unwrap();
    flock(&held, libc::LOCK_EX | libc::LOCK_NB).unwrap();
    let other = File::open(a("g")).unwrap();
    assert_eq!(flock(&other, libc::LOCK_EX | libc::LOCK_NB), Err(libc::EWOULDBLOCK), "the lock did not hold");
    drop(held);
    let t = std::time::Instant::now();
    while flock(&other, libc::LOCK_EX | libc::LOCK_NB).is_err() {
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "the lock outlived its holder's close");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(other);

    // Changed by the first mount (same size), then by the second: each reads the other's.
    let mut changed = data.clone();
    changed[100..107].copy_from_slice(b"changed");
    fs::OpenOptions::new().write(true).open(a("g")).unwrap().write_all_at(b"changed", 100).unwrap();
    assert!(fs::read(b("g")).unwrap() == changed, "the second mount read its old bytes after a change");
    assert!(fs::read(a("g")).unwrap() == changed, "the first mount read other bytes after its own change");
    changed[200..206].copy_from_slice(b"second");
    fs::OpenOptions::new().write(true).open(b("g")).unwrap().write_all_at(b"second", 200).unwrap();
    assert!(fs::read(a("g")).unwrap() == changed, "the first mount read its old bytes after a change");
    let _ = Command::new("umount").arg("-l").arg(&second).status();
}

/// Two mounts with leases: what the second caches (stats answered by the kernel, no
/// request) it drops the moment the first changes it — a chmod, a write closed, a rename,
/// an unlink, a name made where a lookup found none, an ACL — each seen on the very next
/// call, with the MDS revoking a lease for each. A mount that stops answering callbacks
/// (stopped) is evicted within the callback timeout instead of holding the change up, and
/// once running again drops everything it cached and sees the change.
#[test]
fn leases_keep_two_mounts_coherent_and_a_silent_mount_is_evicted() {
    let (fs, mgs, second, second_pid) = leased_pair("leases");
    let (a, b) = (|n: &str| fs.mnt.join(n), |n: &str| second.join(n));
    fs::write(a("f"), b"12345").unwrap();
    let mode = |p: &Path| fs::metadata(p).map(|m| m.permissions().mode() & 0o7777).map_err(|e| e.raw_os_error());
    let revoked = || figure(&mds_param(&mgs, "mdt.*.leases"), "revoked");
    // Cached: repeated stats of the second mount cost the MDS nothing.
    for _ in 0..2 {
        // The first takes the leases (of the mount's root too, asked with the second).
        assert_eq!(mode(&b("f")), Ok(0o644));
    }
    let asked = fs.mds_ops("getattr") + fs.mds_ops("lookup");
    for _ in 0..100 {
        assert_eq!(fs::metadata(b("f")).unwrap().len(), 5);
    }
    assert_eq!(fs.mds_ops("getattr") + fs.mds_ops("lookup"), asked, "stats under a lease ask nothing");
    // Each change through the first mount is seen by the second at once.
    let mut before = revoked();
    let mut step = |what: &str, change: &dyn Fn(), check: &dyn Fn() -> bool| {
        change();
        assert!(check(), "{what}: the second mount still shows the old state");
        let now = revoked();
        assert!(now > before, "{what}: no lease was revoked (the check passed without one)");
        before = now;
    };
    step("chmod", &|| fs::set_permissions(a("f"), fs::Permissions::from_mode(0o600)).unwrap(), &|| {
        mode(&b("f")) == Ok(0o600)
    });
    step(
        "a closed write",
        &|| {
            let mut f = fs::OpenOptions::new().append(true).open(a("f")).unwrap();
            f.write_all(b"678").unwrap();
        },
        &|| fs::metadata(b("f")).unwrap().len() == 8 && fs::read(b("f")).unwrap() == b"12345678",
    );
    step("rename", &|| fs::rename(a("f"), a("g")).unwrap(), &|| mode(&b("f")) == Err(Some(libc::ENOENT)));
    assert_eq!(fs::read(b("g")).unwrap(), b"12345678");
    step("unlink", &|| fs::remove_file(a("g")).unwrap(), &|| mode(&b("g")) == Err(Some(libc::ENOENT)));
    // A name the second mount found missing (a cached negative entry) made by the first.
    assert_eq!(mode(&b("h")), Err(Some(libc::ENOENT)));
    assert_eq!(mode(&b("h")), Err(Some(libc::ENOENT)));
    step("create", &|| fs::write(a("h"), b"x").unwrap(), &|| mode(&b("h")) == Ok(0o644));
    let acl = |p: &Path| {
        let out = Command::new("getfacl").args(["-c", "-p"]).arg(p).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(!acl(&b("h")).contains("user:daemon"));
    step(
        "setfacl",
        &|| assert!(Command::new("setfacl").args(["-m", "u:daemon:r"]).arg(a("h")).status().unwrap().success()),
        &|| acl(&b("h")).contains("user:daemon:r--"),
    );
    // The second mount stops answering: the first's change waits at most the callback
    // timeout, then the MDS evicts it.
    mds_param(&mgs, "mdt.mdt0.lease_callback_timeout_ms=1000");
    assert_eq!(mode(&b("h")), Ok(0o644));
    // SAFETY: signals to the second mount's process, found by its command line.
    assert_eq!(unsafe { libc::kill(second_pid, libc::SIGSTOP) }, 0);
    let t = std::time::Instant::now();
    fs::set_permissions(a("h"), fs::Permissions::from_mode(0o640)).unwrap();
    let waited = t.elapsed();
    assert_eq!(unsafe { libc::kill(second_pid, libc::SIGCONT) }, 0);
    assert!(waited < std::time::Duration::from_secs(8), "the change waited {waited:?} for a stopped mount");
    assert_eq!(figure(&mds_param(&mgs, "mdt.*.leases"), "callback_timeouts"), 1);
    // Running again: evicted, it gives up what it cached and sees the change.
    let t = std::time::Instant::now();
    while mode(&b("h")) != Ok(0o640) {
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "the evicted mount kept a stale cache");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = Command::new("umount").arg("-l").arg(&second).status();
}

fn common_is_mounted(p: &Path) -> bool {
    let p = fs::canonicalize(p).unwrap();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(p.to_str().unwrap()))
}

/// A file system spread over two "nodes" of one cluster file (here both on loopback): one
/// serves the MGS and the MDT, the other the OSTs. The OST node starts first and waits
/// for the MGS; a mount then stripes a file over both OSTs.
#[test]
fn a_cluster_file_spreads_the_services_over_nodes() {
    let root = scratch("cluster");
    let port = free_port();
    let (meta, store, mnt) = (root.join("meta"), root.join("store"), root.join("mnt"));
    fs::create_dir_all(&mnt).unwrap();
    let conf = root.join("cluster.toml");
    fs::write(
        &conf,
        format!(
            "fsname = \"two\"\nmgs = \"127.0.0.1@tcp:{port}\"\n\n\
             [[node]]\nname = \"meta\"\nhost = \"127.0.0.1\"\ndata = \"{}\"\nmgs = true\nmdts = [0]\nmdt_size = \"64M\"\n\n\
             [[node]]\nname = \"store\"\nhost = \"127.0.0.1\"\ndata = \"{}\"\nosts = [0, 1]\nost_size = \"64M\"\nmdt_size = \"64M\"\n",
            meta.display(),
            store.display()
        ),
    )
    .unwrap();
    /// Stops both nodes and removes the folder, pass or fail.
    struct Down(Vec<PathBuf>, PathBuf, PathBuf);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.1).output();
            for d in &self.0 {
                let _ = nacre().arg("down").arg("--data").arg(d).output();
            }
            let _ = fs::remove_dir_all(&self.2);
        }
    }
    let _down = Down(vec![store.clone(), meta.clone()], mnt.clone(), root.clone());
    // Bad cluster files are refused with the reason.
    let bad = root.join("bad.toml");
    fs::write(&bad, format!("fsname = \"two\"\nmgs = \"127.0.0.1@tcp:{port}\"\n[[node]]\nname = \"a\"\nhost = \"127.0.0.1\"\ndata = \"/tmp/x\"\nosts = [1]\n")).unwrap();
    let out = nacre().args(["server", "--node", "a", "--config"]).arg(&bad).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("MGS"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = nacre().args(["server", "--node", "nope", "--config"]).arg(&conf).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no node \"nope\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let start = move |conf: PathBuf, node: &str| {
        let out = nacre().args(["server", "--node", node, "--config"]).arg(&conf).output().unwrap();
        assert!(out.status.success(), "server {node}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let store_node = std::thread::spawn({
        let conf = conf.clone();
        move || start(conf, "store")
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    let m = start(conf.clone(), "meta");
    assert!(m.contains("ready") && m.contains("MGS MDT0"), "{m}");
    let s = store_node.join().unwrap();
    assert!(s.contains("ready") && s.contains("OST0 OST1"), "{s}");
    let out = nacre().args(["mount", "--mgs", &format!("127.0.0.1@tcp:{port}")]).arg(&mnt).output().unwrap();
    assert!(out.status.success(), "mount: {}", String::from_utf8_lossy(&out.stderr));
    let out = nacre().args(["setstripe", "-c", "-1", "-S", "64K"]).arg(mnt.join("wide")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    fs::write(mnt.join("wide"), &data).unwrap();
    assert!(fs::read(mnt.join("wide")).unwrap() == data);
    let out = nacre().arg("getstripe").arg(mnt.join("wide")).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("lmm_stripe_count:  -1"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let objects =
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.trim_start().starts_with(['0', '1'])).count();
    assert_eq!(objects, 2, "one object on each OST node's target:\n{}", String::from_utf8_lossy(&out.stdout));
    let out = nacre().arg("df").arg(&mnt).output().unwrap();
    let df = String::from_utf8_lossy(&out.stdout);
    assert!(df.contains("two-OST0001_UUID") && df.contains("two-MDT0000_UUID"), "{df}");
    let out = nacre().arg("umount").arg(&mnt).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for d in [&store, &meta] {
        let out = nacre().arg("down").arg("--data").arg(d).output().unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).contains("stopped"), "{}", String::from_utf8_lossy(&out.stdout));
    }
}

/// `up --per-service`: the MGS, the MDT, each OST and the mount each in a process of its
/// own; `down` stops them all and takes the mount off.
#[test]
fn up_per_service_runs_a_process_for_each_and_down_stops_them_all() {
    let root = scratch("per-service");
    let (data, mnt) = (root.join("data"), root.join("mnt"));
    fs::create_dir_all(&mnt).unwrap();
    let up = || up_per_service(&data, &mnt, free_port());
    let out = up();
    let _down = Up { data: data.clone(), mnt: mnt.clone(), port: 0 };
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for what in ["(MGS)", "(OST0)", "(OST1)", "(MDT0)", "mounted on"] {
        assert!(text.contains(what), "{what} missing from:\n{text}");
    }
    fs::write(mnt.join("f"), b"per service").unwrap();
    assert_eq!(fs::read(mnt.join("f")).unwrap(), b"per service");
    let again = up();
    assert!(!again.status.success(), "a second up on a running folder");
    let out = nacre().arg("down").arg("--data").arg(&data).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("4 processes"), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(!common_is_mounted(&mnt));
    // Back, one process this time: the same data.
    let out = nacre()
        .args(["up", "--port"])
        .arg(free_port().to_string())
        .arg("--data")
        .arg(&data)
        .arg("--mount")
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(fs::read(mnt.join("f")).unwrap(), b"per service");
}

/// The MDS's process killed (SIGKILL) under a live mount and started again, at a new port
/// the mount learns from the MGS: the mount replays what the MDS had answered but not
/// committed (files made, written on the MDT, renamed, removed), a file open across the
/// kill keeps working through its descriptor, a file made while the MDS was down is made
/// once it is back, and nothing answered is lost.
#[test]
fn a_killed_mds_process_comes_back_and_the_mount_replays_what_it_had_not_committed() {
    let fs = Up::start_with("mds-kill", &["--per-service"]);
    let (data, mnt) = (fs.data.clone(), fs.mnt.clone());
    // Commits at most every 10 s from here: what follows is answered, not committed.
    mds_param(&fs.mgs(), "mdt.mdt0.commit_interval_ms=10000");
    let d = mnt.join("d");
    fs::create_dir(&d).unwrap();
    // Files on the MDT alone: a removed file's OST objects would be destroyed in the
    // background, and that change waits for its commit, which would commit the rest.
    let out = nacre().args(["setstripe", "-E", "64K", "-L", "mdt"]).arg(&d).output().unwrap();
    assert!(out.status.success(), "setstripe: {}", String::from_utf8_lossy(&out.stderr));
    let body = |i: usize| format!("file {i} written before the kill").into_bytes();
    for i in 0..20 {
        fs::write(d.join(format!("f{i}")), body(i)).unwrap();
    }
    fs::rename(d.join("f0"), d.join("renamed")).unwrap();
    fs::remove_file(d.join("f1")).unwrap();
    let mut held = OpenOptions::new().read(true).write(true).open(d.join("f2")).unwrap();
    // A lock held across the kill, and one taken and dropped before it.
    let (mut holder, mut other) = (Locker::start(), Locker::start());
    assert_eq!(holder.ask("w", &d.join("f3"), 0, 10), "ok");
    assert_eq!(holder.ask("r", &d.join("f4"), 0, 10), "ok");
    assert_eq!(holder.ask("u", &d.join("f4"), 0, 10), "ok");
    let commits = mds_param(&fs.mgs(), "mdt.*.commits");
    assert!(
        figure(&commits, "last_committed") + 20 < figure(&commits, "last_transno"),
        "the changes are answered, not committed: {commits}"
    );
    let pid = fs::read_to_string(data.join("nacre-mdt0.pid")).unwrap();
    assert!(Command::new("kill").args(["-9", pid.trim()]).status().unwrap().success());
    // Made while the MDS is down: sent again until it is back, then run after recovery.
    let during = {
        let p = d.join("during");
        std::thread::spawn(move || fs::write(p, b"made during the restart"))
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out =
        nacre().args(["server", "--config"]).arg(data.join("cluster.toml")).args(["--node", "mdt0"]).output().unwrap();
    assert!(out.status.success(), "restart: {}", String::from_utf8_lossy(&out.stderr));
    during.join().unwrap().unwrap();
    assert_eq!(fs::read(d.join("during")).unwrap(), b"made during the restart");
    // Every answered change is back once the mount has replayed.
    let mut want: Vec<String> = (2..20).map(|i| format!("f{i}")).collect();
    want.extend(["renamed".into(), "during".into()]);
    want.sort();
    let mut names: Vec<String> =
        fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, want);
    for i in 2..20 {
        assert_eq!(fs::read(d.join(format!("f{i}"))).unwrap(), body(i), "f{i}");
    }
    assert_eq!(fs::read(d.join("renamed")).unwrap(), body(0));
    // The descriptor opened before the kill still reads and writes.
    let mut got = Vec::new();
    held.read_to_end(&mut got).unwrap();
    assert_eq!(got, body(2));
    held.write_all_at(b"FILE", 0).unwrap();
    drop(held);
    assert!(fs::read(d.join("f2")).unwrap().starts_with(b"FILE 2 written"));
    let status = mds_param(&fs.mgs(), "mdt.*.recovery_status");
    assert!(status.contains("status: COMPLETE") && status.contains("completed_clients: 1/1"), "{status}");
    assert!(figure(&status, "replayed_requests:") > 20, "the changes came back by replay: {status}");
    // The lock came back with the mount's replay; the dropped one did not.
    assert_eq!(other.ask("w", &d.join("f3"), 5, 1), "err 11");
    assert_eq!(other.ask("w", &d.join("f4"), 5, 1), "ok");
    // What the mount kept at the MDS for the dropped one, the restart forgot: asked
    // again, it is the MDS's to refuse.
    assert_eq!(holder.ask("r", &d.join("f4"), 0, 10), "err 11");
    assert_eq!(holder.ask("u", &d.join("f3"), 0, 0), "ok");
    assert_eq!(other.ask("w", &d.join("f3"), 5, 1), "ok");
}

/// A serving process of `up --per-service` stopped (SIGSTOP) for a test; it runs again
/// (SIGCONT) when this is dropped, pass or fail.
struct Stopped(i32);

impl Stopped {
    /// Stop the process serving `tag` (`ost0`, `mdt1`) of the file system in `data`.
    fn new(data: &Path, tag: &str) -> Stopped {
        let pid: i32 = fs::read_to_string(data.join(format!("nacre-{tag}.pid"))).unwrap().trim().parse().unwrap();
        // SAFETY: a signal to a process `up` started for this test.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: a signal to the process this test stopped.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// Whether thread `t` finishes within `limit` (it is left running if not).
fn finishes_within<T>(t: &std::thread::JoinHandle<T>, limit: std::time::Duration) -> bool {
    let started = std::time::Instant::now();
    while !t.is_finished() && started.elapsed() < limit {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    t.is_finished()
}

/// Reads run on the mount's kernel reader threads, but never on all of them: with the
/// process of the OST holding four files stopped (SIGSTOP) and a reader on each file,
/// the mount still answers lookups and makes, writes and reads a file on the MDT; the
/// reads return the right bytes once the OST runs again.
#[test]
fn reads_stuck_on_a_stopped_ost_leave_the_mount_answering() {
    let fs = Up::start_with("stuck-ost", &["--per-service"]);
    let (data, mnt) = (fs.data.clone(), fs.mnt.clone());
    let d = mnt.join("on-ost0");
    fs::create_dir(&d).unwrap();
    run(&["setstripe", "-c", "1", "-i", "0"], &d);
    let body = |i: usize| -> Vec<u8> { (0..1_500_000u32).map(|b| (b as usize * 7 + i) as u8).collect() };
    for i in 0..4 {
        fs::write(d.join(format!("f{i}")), body(i)).unwrap();
    }
    // Files here live on the MDT alone (no object on the stopped OST to glimpse).
    let md = mnt.join("mdt-only");
    fs::create_dir(&md).unwrap();
    run(&["setstripe", "-E", "64K", "-L", "mdt"], &md);
    // The reads must reach the OST, not the kernel's page cache.
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let cont = Stopped::new(&data, "ost0");
    let readers: Vec<_> = (0..4)
        .map(|i| {
            let p = d.join(format!("f{i}"));
            std::thread::spawn(move || fs::read(p).unwrap())
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Meanwhile, what needs only the MDT is answered.
    let elsewhere = std::thread::spawn(move || {
        assert!(fs::metadata(md.join("no-such-name")).is_err());
        fs::write(md.join("small"), b"on the MDT").unwrap();
        fs::read(md.join("small")).unwrap()
    });
    let answered = finishes_within(&elsewhere, std::time::Duration::from_secs(10));
    assert!(readers.iter().all(|r| !r.is_finished()), "the OST was stopped, yet a read returned");
    drop(cont);
    assert!(answered, "the mount answered nothing while reads waited for a stopped OST");
    assert_eq!(elsewhere.join().unwrap(), b"on the MDT");
    for (i, r) in readers.into_iter().enumerate() {
        assert!(r.join().unwrap() == body(i), "f{i} after the OST came back");
    }
}

/// Metadata requests also run on the mount's kernel reader threads, and never on all of
/// them: with the process of MDT 1 stopped and a create waiting on it in each of eight
/// directories (as many as the mount has reader threads), the mount still looks up, makes,
/// writes and reads files on MDT 0; the creates finish once MDT 1 runs again.
#[test]
fn creates_stuck_on_a_stopped_mdt_leave_the_mount_answering() {
    let fs = Up::start_with("stuck-mdt", &["--per-service", "--mdts", "2"]);
    let (data, mnt) = (fs.data.clone(), fs.mnt.clone());
    // A create holds its directory's lock in the kernel: one directory each, so that
    // all of them reach the mount, one for each of its kernel reader threads.
    const READERS: usize = 8;
    let on1: Vec<_> = (0..READERS).map(|i| mnt.join(format!("on1-{i}"))).collect();
    for d in &on1 {
        run(&["mkdir", "-i", "1"], d);
    }
    let on0 = mnt.join("on0");
    fs::create_dir(&on0).unwrap();
    fs::write(on0.join("before"), b"made before").unwrap();
    let cont = Stopped::new(&data, "mdt1");
    let makers: Vec<_> = (0..READERS)
        .map(|i| {
            let p = on1[i].join(format!("f{i}"));
            std::thread::spawn(move || fs::write(&p, format!("file {i}")).map(|()| fs::read(&p).unwrap()))
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Meanwhile, what needs only MDT 0 (and the OSTs) is answered.
    let elsewhere = std::thread::spawn(move || {
        assert!(fs::metadata(on0.join("no-such-name")).is_err());
        fs::write(on0.join("during"), b"made during").unwrap();
        (fs::read(on0.join("before")).unwrap(), fs::read(on0.join("during")).unwrap())
    });
    let answered = finishes_within(&elsewhere, std::time::Duration::from_secs(10));
    assert!(makers.iter().all(|m| !m.is_finished()), "MDT 1 was stopped, yet a create in it returned");
    drop(cont);
    assert!(answered, "the mount answered nothing while creates waited for a stopped MDT");
    assert_eq!(elsewhere.join().unwrap(), (b"made before".to_vec(), b"made during".to_vec()));
    for (i, m) in makers.into_iter().enumerate() {
        assert_eq!(m.join().unwrap().unwrap(), format!("file {i}").into_bytes(), "f{i} after MDT 1 came back");
    }
}

/// `nacre up --per-service` with two small OSTs, the MGS on `port`, mounted on `mnt`.
fn up_per_service(data: &Path, mnt: &Path, port: u16) -> std::process::Output {
    nacre()
        .args(["up", "--per-service", "--osts", "2", "--ost-size", "64M", "--mdt-size", "64M", "--port"])
        .arg(port.to_string())
        .arg("--data")
        .arg(data)
        .arg("--mount")
        .arg(mnt)
        .output()
        .unwrap()
}

fn run(args: &[&str], path: &Path) -> String {
    let out = nacre().args(args).arg(path).output().unwrap();
    assert!(out.status.success(), "nacre {args:?} {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The layout commands on a mount of a file system with two MDTs, the client tunables
/// through get-param/set-param without --server, the `lustre.lov` xattr, a mount with the
/// kernel's writeback cache, and flock between two processes of one machine.
#[test]
fn layout_commands_tunables_and_mount_options() {
    let fs = Up::start_with("commands", &["--mdts", "2", "--writeback-cache"]);
    let m = &fs.mnt;
    run(&["mkdir", "-i", "1"], &m.join("on1"));
    let d = run(&["getdirstripe"], &m.join("on1"));
    assert!(d.contains("lmv_stripe_count: 0 lmv_stripe_offset: 1"), "{d}");
    run(&["setdirstripe", "-c", "2"], &m.join("striped"));
    let d = run(&["getdirstripe"], &m.join("striped"));
    assert!(d.contains("lmv_stripe_count: 2"), "{d}");
    run(&["setdirstripe", "-D", "-c", "1", "-i", "-1", "--max-inherit-rr", "2"], &m.join("striped"));
    let d = run(&["getdirstripe"], &m.join("striped"));
    assert!(
        d.contains("default: lmv_stripe_count: 1 lmv_stripe_offset: -1") && d.contains("lmv_max_inherit_rr: 2"),
        "{d}"
    );
    for i in 0..6 {
        fs::write(m.join(format!("striped/f{i}")), format!("file {i}")).unwrap();
    }
    // A directory default layout, files made under it; find by stripe count and OST.
    run(&["setstripe", "-c", "2", "-S", "128K"], &m.join("on1"));
    let g = run(&["getstripe"], &m.join("on1"));
    assert!(g.contains("lmm_stripe_count:  2") && g.contains("lmm_stripe_size:   131072"), "{g}");
    run(&["setstripe", "-c", "1", "-i", "1"], &m.join("on1/one"));
    let e = nacre().args(["setstripe", "-c", "1"]).arg(m.join("on1/one")).output().unwrap();
    assert!(!e.status.success() && String::from_utf8_lossy(&e.stderr).contains("exists"));
    let e = nacre().args(["setstripe", "-S", "100K"]).arg(m.join("on1/bad")).output().unwrap();
    let why = String::from_utf8_lossy(&e.stderr);
    assert!(!e.status.success() && why.contains("64"), "{why}");
    // Written through the kernel's writeback cache, read back after a remount of sorts
    // (the file is closed and opened again).
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 241) as u8).collect();
    fs::write(m.join("on1/two"), &big).unwrap();
    assert!(fs::read(m.join("on1/two")).unwrap() == big);
    assert_eq!(fs::metadata(m.join("on1/two")).unwrap().len(), big.len() as u64);
    let f = find(&[], m);
    assert!(f.contains("/on1/one") && f.contains("/on1/two") && f.contains("/striped/f5"), "{f}");
    let f = find(&["--stripe-count", "2"], m);
    assert!(f.contains("/on1/two") && !f.contains("/on1/one"), "{f}");
    let f = find(&["--ost", "1", "--type", "f"], m);
    assert!(f.contains("/on1/one"), "{f}");
    let f = find(&["--name", "o*", "--type", "f"], m);
    assert!(f.lines().count() == 1 && f.contains("/on1/one"), "{f}");
    let f = find(&["--size", "+1M"], m);
    assert!(f.lines().count() == 1 && f.contains("/on1/two"), "{f}");
    // lustre.lov holds the layout.
    let lov = CString::new("lustre.lov").unwrap();
    let p = CString::new(m.join("on1/two").into_os_string().into_encoded_bytes()).unwrap();
    let mut buf = [0u8; 4096];
    // SAFETY: valid C strings and buffer.
    let n = unsafe { libc::getxattr(p.as_ptr(), lov.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n > 0, "lustre.lov: {}", std::io::Error::last_os_error());
    let l = nacre_proto::layout::Layout::decode(&buf[..n as usize]).unwrap();
    assert!(format!("{l}").contains("lmm_stripe_count:  2"), "{l}");
    // Tunables of the mount, with no --server.
    let get = |p: &str| String::from_utf8_lossy(&nacre().args(["get-param", p]).output().unwrap().stdout).into_owned();
    let p = get("osc.*.max_rpcs_in_flight");
    assert!(p.contains("osc.nacre-OST0001-osc.max_rpcs_in_flight=8"), "{p}");
    let out = nacre().args(["set-param", "llite.*.max_read_ahead_mb=32"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(get("llite.*.max_read_ahead_mb").contains("=32"));
    let out = nacre().args(["set-param", "llite.*.max_read_ahead_mb=lots"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not a number"));
    // The link to each target: every NID it may be served at, and the one in use.
    let imp = get("mdc.*.import");
    assert!(
        imp.contains("target: nacre-MDT0000")
            && imp.contains("failover_nids: [127.0.0.1@tcp:")
            && imp.contains("current_connection: 127.0.0.1@tcp:"),
        "{imp}"
    );
    let out = nacre().args(["set-param", "mdc.*.import=1"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("it is not set"));
    // flock: a second process cannot take a lock the first holds (kernel-local locks).
    let lockf = m.join("on1/one");
    let mut holder = Command::new("flock").arg(&lockf).args(["-c", "sleep 2"]).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let st = Command::new("flock").arg("-n").arg(&lockf).arg("true").status().unwrap();
    assert!(!st.success(), "a second flock got the lock");
    holder.wait().unwrap();
    assert!(Command::new("flock").arg("-n").arg(&lockf).arg("true").status().unwrap().success());
}

/// `--root-squash`: root acts as nobody through the mount.
#[test]
fn root_squash_makes_root_nobody() {
    let fs = Up::start_with("squash", &["--root-squash"]);
    let m = &fs.mnt;
    // Made through the library (not squashed): root's, 0644.
    run(&["setstripe", "-c", "1"], &m.join("roots"));
    let e = fs::create_dir(m.join("as-root")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    let e = OpenOptions::new().write(true).open(m.join("roots")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    assert_eq!(fs::read(m.join("roots")).unwrap(), b"", "others may read");
}

fn find(args: &[&str], path: &Path) -> String {
    let out = nacre().arg("find").arg(path).args(args).output().unwrap();
    assert!(out.status.success(), "find: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The last line of `nacre …`'s output, which must succeed, as JSON.
fn json_of(out: &std::process::Output, what: &str) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{what}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(text.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{what}: {e}: {text}"))
}

const IO500_TINY: [&str; 14] = [
    "--tasks",
    "4",
    "--stonewall",
    "0.3",
    "--ior-easy-size",
    "2M",
    "--ior-easy-transfer",
    "512K",
    "--ior-hard-segments",
    "30",
    "--mdtest-easy-files",
    "100",
    "--mdtest-hard-files",
    "100",
];

/// `nacre io500` through the mount (POSIX) and through the library (native) on the same
/// file system: every phase verified, io500.sh's layouts set, nothing left, and the
/// `--json` file holding what the last line says. The native run has a reference run on
/// a local folder beside it, with each phase's ratio.
#[test]
fn io500_runs_through_the_mount_and_natively() {
    let fs = Up::start("io500");
    let json_file = fs.mnt.parent().unwrap().join("io500.json");
    // In the file system's scratch folder, which goes with it, pass or fail.
    let local = fs.mnt.parent().unwrap().join("reference");
    fs::create_dir_all(&local).unwrap();
    for api in ["posix", "native"] {
        let mut cmd = nacre();
        cmd.args(["io500", "--api", api, "--dir"]).arg(&fs.mnt).args(IO500_TINY).arg("--json").arg(&json_file);
        if api == "native" {
            cmd.arg("--reference").arg(format!("local={}", local.display()));
        }
        let out = cmd.output().unwrap();
        let j = json_of(&out, api);
        if api == "native" {
            let r = &j["references"]["local"];
            assert_eq!(r["phases"].as_array().unwrap().len(), 13, "{j}");
            assert_eq!(r["dir"], local.display().to_string());
            let ratios = j["ratios"]["run/local"].as_object().unwrap();
            assert_eq!(ratios.len(), 13 + 3, "every phase, bandwidth, md and score: {j}");
            assert!(ratios.values().all(|v| v.as_f64().unwrap() > 0.0), "{j}");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("== side by side") && text.contains("run/local"), "{text}");
            assert_eq!(fs::read_dir(&local).unwrap().count(), 0, "the reference run removed its files");
        }
        assert_eq!(j["api"], api);
        let phases = j["phases"].as_array().unwrap();
        assert_eq!(phases.len(), 13, "{j}");
        assert!(phases.iter().all(|p| p["value"].as_f64().unwrap() > 0.0), "{j}");
        assert_eq!(j["layouts"].as_array().unwrap().len(), 6, "the Helma layouts on Nacre: {j}");
        assert!(j["score"]["total"].as_f64().unwrap() > 0.0);
        let file: serde_json::Value = serde_json::from_str(&fs::read_to_string(&json_file).unwrap()).unwrap();
        assert_eq!(file, j);
        let text = String::from_utf8_lossy(&out.stdout);
        let runs = if api == "native" { 2 } else { 1 };
        assert_eq!(text.lines().filter(|l| l.starts_with("[RESULT]")).count(), 12 * runs, "{text}");
        assert_eq!(fs::read_dir(&fs.mnt).unwrap().count(), 0, "{api}: the run removed its files");
    }
    // Bad input: named, and nothing is made.
    let out = nacre().args(["io500", "--api", "native", "--dir", "/tmp", "--tasks", "2"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not on a Nacre mount"), "{out:?}");
    let out = nacre().args(["io500", "--dir"]).arg(&fs.mnt).args(["--tasks", "0"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("0 tasks"), "{out:?}");
    let cfg = fs.mnt.parent().unwrap().join("io500.toml");
    fs::write(&cfg, "stonewal = 3\n").unwrap();
    let out = nacre().args(["io500", "--dir"]).arg(&fs.mnt).arg("--config").arg(&cfg).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field `stonewal`"), "{out:?}");
    for (args, why) in [
        (vec!["--reference", "nodir"], "--reference nodir: NAME=DIR"),
        (vec!["--reference", "run=/tmp"], "other than `run`"),
        (vec!["--reference", "a=/tmp", "--reference", "a=/var/tmp"], "--reference a: named twice"),
    ] {
        let out = nacre().args(["io500", "--dir"]).arg(&fs.mnt).args(&args).output().unwrap();
        assert!(String::from_utf8_lossy(&out.stderr).contains(why), "{args:?}: {out:?}");
    }
    assert_eq!(fs::read_dir(&fs.mnt).unwrap().count(), 0);
}

/// `nacre demo`, small: up, IO500 three ways, the table, down, nothing left.
#[test]
fn demo_runs_io500_three_ways_and_leaves_nothing() {
    // A folder the demo did not make is refused, and left as it was.
    let theirs = scratch("not-the-demos");
    fs::write(theirs.join("precious"), b"keep").unwrap();
    let out = nacre().arg("demo").arg("--work").arg(&theirs).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("was not made by nacre demo"), "{out:?}");
    assert_eq!(fs::read(theirs.join("precious")).unwrap(), b"keep");
    fs::remove_dir_all(&theirs).unwrap();

    // A passthrough program that is not there is refused before anything starts.
    let work = scratch("demo");
    fs::remove_dir(&work).unwrap();
    let out = nacre().arg("demo").arg("--work").arg(&work).args(["--passthrough", "/nonexistent/pt"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--passthrough /nonexistent/pt: no such program"), "{out:?}");
    assert!(!work.exists(), "nothing made");

    let out = nacre()
        .arg("demo")
        .arg("--work")
        .arg(&work)
        .args(["--port", &free_port().to_string(), "--ost-size", "128M", "--mdt-size", "64M"])
        .args(["--tasks", "4", "--stonewall", "0.3", "--ior-easy-size", "2M", "--ior-hard-segments", "30"])
        .args(["--mdtest-easy-files", "100", "--mdtest-hard-files", "100"])
        .output()
        .unwrap();
    let j = json_of(&out, "demo");
    for k in ["score_mount", "score_native", "score_local", "ratio_mount", "ratio_native"] {
        assert!(j[k].as_f64().unwrap() > 0.0, "{k}: {j}");
    }
    assert_eq!(j["phases"].as_object().unwrap().len(), 13, "{j}");
    assert_eq!(j["phases"]["find"].as_object().unwrap().len(), 3, "{j}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("mount/local") && text.contains("left behind: 0 entries"), "{text}");
    assert!(!work.exists(), "the demo removed its folder");
}

/// Several handles of one file in one mount (ior-hard's pattern): interleaved writes to
/// disjoint ranges from four threads, then overlapping writes whose order must hold (the
/// later one wins), all read back through yet another handle.
#[test]
fn handles_of_one_file_write_disjoint_and_overlapping_ranges() {
    let fs = Up::start("handles");
    let path = fs.mnt.join("shared");
    File::create(&path).unwrap();
    const T: usize = 47_008;
    let threads: Vec<_> = (0..4u8)
        .map(|rank| {
            let path = path.clone();
            std::thread::spawn(move || {
                let f = OpenOptions::new().write(true).open(&path).unwrap();
                for seg in 0..40usize {
                    let off = ((seg * 4 + rank as usize) * T) as u64;
                    f.write_all_at(&vec![rank.wrapping_mul(40).wrapping_add(seg as u8); T], off).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let got = fs::read(&path).unwrap();
    assert_eq!(got.len(), 160 * T);
    for (i, block) in got.chunks(T).enumerate() {
        let (seg, rank) = (i / 4, (i % 4) as u8);
        assert!(block.iter().all(|&b| b == rank.wrapping_mul(40).wrapping_add(seg as u8)), "block {i}");
    }
    // Overlapping: a, then b over part of it, then a again over part of b, each through
    // its own handle, no close in between.
    let (a, b) =
        (OpenOptions::new().write(true).open(&path).unwrap(), OpenOptions::new().write(true).open(&path).unwrap());
    a.write_all_at(&[1u8; 100_000], 0).unwrap();
    b.write_all_at(&[2u8; 50_000], 25_000).unwrap();
    a.write_all_at(&[3u8; 10_000], 40_000).unwrap();
    let mut want = vec![1u8; 100_000];
    want[25_000..75_000].fill(2);
    want[40_000..50_000].fill(3);
    let mut got = vec![0u8; 100_000];
    File::open(&path).unwrap().read_exact_at(&mut got, 0).unwrap();
    assert!(got == want, "the later write wins where they overlap");
}

/// The OSTs' used space (`nacre df`) is what the files' `st_blocks` add up to, within 1%,
/// after writes, overwrites, truncates and unlinks of small, middling and large files: small
/// objects take 4 KiB blocks, and each writer publishes its objects' blocks to the MDT.
#[test]
fn df_used_space_is_the_sum_of_st_blocks() {
    let fs = Up::start("blocks");
    let m = &fs.mnt;
    for (dir, opts) in [("one", ["-c", "1"]), ("two", ["-c", "2"])] {
        fs::create_dir(m.join(dir)).unwrap();
        run(&["setstripe", opts[0], opts[1]], &m.join(dir));
    }
    let mut paths = Vec::new();
    for (i, size) in [3901usize, 1, 4096, 20_000, 200_000, 700_000, 3 << 20, 9_000_000].into_iter().enumerate() {
        for dir in ["one", "two"] {
            let p = m.join(format!("{dir}/f{i}"));
            fs::write(&p, vec![i as u8 + 1; size]).unwrap();
            paths.push(p);
        }
    }
    // Overwrites, truncates down and up, appends, unlinks.
    fs::write(&paths[4], vec![9u8; 10_000]).unwrap();
    OpenOptions::new().write(true).open(&paths[9]).unwrap().set_len(100).unwrap();
    OpenOptions::new().write(true).open(&paths[12]).unwrap().set_len(1 << 20).unwrap();
    OpenOptions::new().write(true).open(&paths[3]).unwrap().set_len(50_000).unwrap();
    OpenOptions::new().append(true).open(&paths[0]).unwrap().write_all(&[5u8; 30_000]).unwrap();
    for p in [&paths[14], &paths[7], &paths[1]] {
        fs::remove_file(p).unwrap();
    }
    let blocks = || -> u64 { paths.iter().filter_map(|p| fs::metadata(p).ok()).map(|md| md.blocks() * 512).sum() };
    let osts_used = || -> u64 {
        run(&["df"], m)
            .lines()
            .filter(|l| l.contains("OST") && l.contains("_UUID"))
            .map(|l| l.split_whitespace().nth(2).unwrap().parse::<u64>().unwrap() << 10)
            .sum()
    };
    // Objects of unlinked files are destroyed in the background: wait for it.
    let start = std::time::Instant::now();
    let (mut used, mut counted) = (osts_used(), blocks());
    while used.abs_diff(counted) * 100 > counted && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        (used, counted) = (osts_used(), blocks());
    }
    assert!(counted > 10 << 20, "the files hold {counted} bytes");
    eprintln!("nacre df: {used} bytes used on the OSTs; st_blocks: {counted}");
    assert!(used.abs_diff(counted) * 100 <= counted, "nacre df says {used} bytes used, st_blocks add up to {counted}");
}

/// `st_ino` comes from the FID: the same through two mounts and after the file system is
/// stopped and started again, shared by hard links, distinct between files; `readdir`'s
/// `d_ino` agrees with `stat`.
#[test]
fn inode_numbers_are_the_same_on_every_mount_and_after_a_restart() {
    let fs = Up::start("ino");
    let m = &fs.mnt;
    fs::write(m.join("a"), b"x").unwrap();
    fs::hard_link(m.join("a"), m.join("b")).unwrap();
    fs::create_dir(m.join("d")).unwrap();
    fs::write(m.join("d/c"), b"y").unwrap();
    let inos = |root: &Path| -> Vec<u64> {
        ["a", "b", "d", "d/c"].iter().map(|n| fs::metadata(root.join(n)).unwrap().ino()).collect()
    };
    // In another order: numbers handed out by lookup order would differ.
    let inos_backwards = |root: &Path| -> Vec<u64> {
        let mut v: Vec<u64> =
            ["d/c", "d", "b", "a"].iter().map(|n| fs::metadata(root.join(n)).unwrap().ino()).collect();
        v.reverse();
        v
    };
    let first = inos(m);
    assert_eq!(first[0], first[1], "hard links share their inode number");
    assert!(first[0] != first[2] && first[2] != first[3] && first[0] != first[3], "{first:?}");
    let listed: Vec<u64> = {
        let mut v: Vec<(String, u64)> = fs::read_dir(m)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.file_name().to_string_lossy().into_owned(), std::os::unix::fs::DirEntryExt::ino(&e)))
            .collect();
        v.sort();
        v.into_iter().map(|(_, i)| i).collect()
    };
    assert_eq!(listed, first[..3], "d_ino is st_ino");
    let second = m.parent().unwrap().join("mnt2");
    fs::create_dir_all(&second).unwrap();
    let out = nacre().args(["mount", "--mgs", &fs.mgs()]).arg(&second).output().unwrap();
    assert!(out.status.success(), "nacre mount: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(inos_backwards(&second), first, "another mount");
    let out = nacre().arg("umount").arg(&second).output().unwrap();
    assert!(out.status.success());
    fs.down();
    fs.up();
    assert_eq!(inos_backwards(m), first, "after a stop and start");
}
