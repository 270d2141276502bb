//! What a new user meets first: `nacre up` saying what went wrong on the terminal (a mount
//! point that is a file, a host too small, a serving process that fails), the host space a
//! default file system takes, `io500` scaling itself to the file system, `setstripe` saying
//! what it made, a closed pipe, completions and man pages, and `mount -t nacre` with fstab
//! lines, good and bad.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{free_port, nacre};

fn scratch(name: &str) -> PathBuf {
    common::scratch("first", name)
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn is_mounted(p: &Path) -> bool {
    let p = fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    fs::read_to_string("/proc/self/mountinfo").unwrap().lines().any(|l| l.split(' ').nth(4) == p.to_str())
}

/// `nacre down` and the scratch folder's removal when dropped.
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = nacre().arg("down").arg("--data").arg(self.0.join("data")).output();
        for e in fs::read_dir(&self.0).into_iter().flatten().flatten() {
            if is_mounted(&e.path()) {
                let _ = Command::new("umount").arg("-l").arg(e.path()).output();
            }
        }
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn up(root: &Path, port: u16, extra: &[&str]) -> Output {
    nacre()
        .arg("up")
        .arg("--data")
        .arg(root.join("data"))
        .args(["--port", &port.to_string()])
        .args(extra)
        .output()
        .unwrap()
}

/// A default `nacre up` (four OSTs of 512 MiB, one MDT) with its mount point missing: the
/// mount point is made, the drive files take a small part of the host space the file
/// system offers (thin), and `up` said both figures. Then IO500 with default sizes is
/// scaled to the OSTs' free space, and `setstripe` on a new name says it made a file.
#[test]
fn a_default_up_makes_its_mount_point_and_takes_little_host_space() {
    let root = scratch("default");
    let _down = Down(root.clone());
    let mnt = root.join("mnt/deeper");
    let out = up(&root, free_port(), &["--mount", mnt.to_str().unwrap()]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains(&format!("made the mount point {}", mnt.display())), "{said}");
    assert!(said.contains("of host space taken now, up to"), "{said}");
    assert!(is_mounted(&mnt));

    // Host space taken, against what the file system offers (df's totals).
    let (mut size, mut taken) = (0u64, 0u64);
    let mut todo = vec![root.join("data")];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                todo.push(e.path());
            } else {
                size += m.len();
                taken += m.blocks() * 512;
            }
        }
    }
    let df = nacre().arg("df").arg(&mnt).output().unwrap();
    let df = String::from_utf8_lossy(&df.stdout).into_owned();
    let usable_kib: u64 = df
        .lines()
        .filter(|l| l.contains("_UUID"))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap())
        .sum();
    let usable = usable_kib << 10;
    assert!(usable > 2 << 30, "four OSTs of 512 MiB and an MDT: {df}");
    assert!(taken * 2 < usable * 3, "host space taken {taken} is over 1.5x the usable {usable}");
    assert!(taken < 64 << 20, "thin drive files: {taken} bytes taken of {size}");
    // The index volumes are in proportion to the data: an OST's files are mostly data.
    let ost = |dir: &str| -> u64 {
        fs::read_dir(root.join("data/ost0").join(dir)).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
    };
    assert!(ost("index") * 2 < ost("data"), "index {} against data {}", ost("index"), ost("data"));

    // setstripe on a missing name makes a file and says so; on a directory, a default.
    let out = nacre().args(["setstripe", "-c", "-1", "-S", "4M"]).arg(mnt.join("wide")).output().unwrap();
    assert!(text(&out).contains("made an empty file"), "{}", text(&out));
    assert!(mnt.join("wide").is_file());
    fs::create_dir(mnt.join("widedir")).unwrap();
    let out = nacre().args(["setstripe", "-c", "-1", "-S", "4M"]).arg(mnt.join("widedir")).output().unwrap();
    assert!(text(&out).contains("the default layout of new files"), "{}", text(&out));

    // IO500's default sizes (9.9 TB of ior-easy per task) scaled to what the OSTs hold.
    let out = nacre()
        .args(["io500", "--dir"])
        .arg(&mnt)
        .args(["--tasks", "2", "--stonewall", "0.3", "--ior-hard-segments", "20"])
        .args(["--mdtest-easy-files", "50", "--mdtest-hard-files", "50"])
        .output()
        .unwrap();
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("scaled to fit: ior-easy: at most"), "{said}");
    assert!(said.contains("[SCORE ]"), "{said}");
}

/// Refusals on the terminal, before anything is made: a mount point that is a file, a
/// host whose free space could not hold the drive files (a small tmpfs), and a serving
/// process that fails after it started (its port taken), with the log lines that say why.
#[test]
fn up_refuses_on_the_terminal_and_leaves_nothing() {
    let root = scratch("refuse");
    let _down = Down(root.clone());
    let file = root.join("a-file");
    fs::write(&file, b"x").unwrap();
    let out = up(&root, free_port(), &["--mount", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out).contains("is not a directory"), "{}", text(&out));
    assert!(!root.join("data").exists(), "nothing formatted");

    // A host too small: a 64 MiB tmpfs for a file system of 4.7 GiB of drive files.
    let small = root.join("small");
    fs::create_dir(&small).unwrap();
    let m = Command::new("mount").args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"]).arg(&small).status().unwrap();
    assert!(m.success(), "mounting a tmpfs");
    let out = up(&small, free_port(), &[]);
    let said = text(&out);
    let left: Vec<_> = fs::read_dir(&small).unwrap().collect();
    let _ = Command::new("umount").arg(&small).status();
    assert!(!out.status.success());
    assert!(said.contains("the drive files would take up to 4.7 GiB") && said.contains("free"), "{said}");
    assert!(said.contains("--ost-size"), "the refusal names what to change: {said}");
    assert!(left.is_empty(), "a refused up leaves nothing: {left:?}");

    // The serving process fails (the MGS's port is taken): its log lines are shown.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = up(&root, port, &["--osts", "1", "--ost-size", "64M", "--mdt-size", "32M"]);
    let said = text(&out);
    assert!(!out.status.success());
    assert!(said.contains("nacre.log") && said.contains("says:"), "{said}");
    assert!(said.to_lowercase().contains("address already in use") || said.contains("in use"), "{said}");
    drop(taken);
}

/// A closed pipe ends a command quietly (killed by SIGPIPE, as coreutils); completions for
/// three shells and the man pages come from the command's definitions; --version names
/// the commit.
#[test]
fn cli_manners_pipes_completions_man_pages_version() {
    // `nacre man | head -0`: the reader is gone before the page is written.
    let mut child =
        nacre().args(["completions", "bash"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{}", text(&out));
    assert!(out.stderr.is_empty(), "quiet: {}", String::from_utf8_lossy(&out.stderr));

    for (shell, mark) in [("bash", "_nacre()"), ("zsh", "#compdef nacre"), ("fish", "complete -c nacre")] {
        let out = nacre().args(["completions", shell]).output().unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && s.contains(mark), "{shell}: {}", &s[..s.len().min(200)]);
        assert!(s.contains("setstripe") && s.contains("--ost-size"), "{shell} completes commands and options");
    }
    let out = nacre().args(["completions", "tcsh"]).output().unwrap();
    assert!(!out.status.success() && text(&out).contains("tcsh"), "{}", text(&out));

    let dir = scratch("man");
    let out = nacre().args(["man", "--dir"]).arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for page in ["nacre.1", "nacre-up.1", "nacre-io500.1", "nacre-raid-create.1"] {
        let p = fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(p.contains(".TH"), "{page} is a man page");
    }
    assert!(fs::read_to_string(dir.join("nacre-up.1")).unwrap().contains("ost\\-size"));
    fs::remove_dir_all(&dir).unwrap();

    let out = nacre().arg("--version").output().unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(v.starts_with("nacre ") && v.contains("(commit "), "{v}");
}

/// Puts `/sbin/mount.nacre` in place for the test (if it is not there) and takes it away.
struct Helper(bool);

impl Helper {
    fn install() -> Helper {
        let link = Path::new("/sbin/mount.nacre");
        if link.exists() || link.is_symlink() {
            return Helper(false);
        }
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_nacre"), link).unwrap();
        Helper(true)
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if self.0 {
            let _ = fs::remove_file("/sbin/mount.nacre");
        }
    }
}

fn mount(args: &[&str]) -> Output {
    Command::new("mount").args(args).output().unwrap()
}

/// `mount -t nacre MGS:/FSNAME DIR` and an fstab line mounted with `mount -a`, as a Lustre
/// client mounts; and the bad sources, names and MGSs, each a clear error with no mount and
/// no process left.
#[test]
fn mount_t_nacre_and_fstab_lines() {
    let root = scratch("mount");
    let _down = Down(root.clone());
    let _helper = Helper::install();
    let port = free_port();
    let out = up(&root, port, &["--osts", "1", "--ost-size", "64M", "--mdt-size", "32M"]);
    assert!(out.status.success(), "{}", text(&out));
    let source = format!("127.0.0.1@tcp:{port}:/nacre");
    let (a, b) = (root.join("a"), root.join("b"));
    fs::create_dir_all(&a).unwrap();
    fs::create_dir_all(&b).unwrap();

    let out = mount(&["-t", "nacre", "-o", "attr_timeout=0.5,_netdev", &source, a.to_str().unwrap()]);
    assert!(out.status.success(), "mount -t nacre: {}", text(&out));
    assert!(is_mounted(&a));
    fs::write(a.join("hello"), b"from a").unwrap();
    // A second mount on the same directory is refused.
    let out = mount(&["-t", "nacre", &source, a.to_str().unwrap()]);
    assert!(!out.status.success() && text(&out).contains("already a mount point"), "{}", text(&out));

    // An fstab (of our own, `mount -T`), mounted with `mount -a`, seen from the other mount.
    let fstab = root.join("fstab");
    fs::write(&fstab, format!("# a Nacre client\n{source} {} nacre _netdev,defaults 0 0\n", b.display())).unwrap();
    let out = mount(&["-a", "-T", fstab.to_str().unwrap()]);
    assert!(out.status.success(), "mount -a: {}", text(&out));
    assert_eq!(fs::read(b.join("hello")).unwrap(), b"from a");
    assert!(Command::new("umount").arg(&b).status().unwrap().success());
    assert!(Command::new("umount").arg(&a).status().unwrap().success());
    assert!(!is_mounted(&a) && !is_mounted(&b));

    // Bad input: each refused with mount(8)'s failure status (32) and a clear reason.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap(); // accepts, never answers
    let silent_src = format!("127.0.0.1@tcp:{}:/nacre", silent.local_addr().unwrap().port());
    let dead_src = format!("127.0.0.1@tcp:{}:/nacre", free_port());
    let other_fs = format!("127.0.0.1@tcp:{port}:/other");
    for (src, opts, says) in [
        ("127.0.0.1@tcp:9400/nacre", "", "no :/ before"),
        ("nowhere:/nacre", "", "expected MGS_NID:/FSNAME"),
        (&format!("127.0.0.1@tcp:{port}:/bad-name!"), "", "1 to 16 letters"),
        (&other_fs, "", "serves file system \"nacre\", not \"other\""),
        (&dead_src, "", "connection"),
        (&silent_src, "timeout=1", "no answer within 1 s"),
        (&source, "bogus", "unknown option \"bogus\""),
        (&source, "ro", "read-write"),
    ] {
        let mut args = vec!["-t", "nacre"];
        if !opts.is_empty() {
            args.extend(["-o", opts]);
        }
        args.extend([src, a.to_str().unwrap()]);
        let out = mount(&args);
        assert_eq!(out.status.code(), Some(32), "{src} -o {opts}: {}", text(&out));
        assert!(text(&out).contains(says), "{src} -o {opts}: wanted {says:?} in {}", text(&out));
        assert!(!is_mounted(&a), "{src}: no mount left");
    }
    drop(silent);
    // No mount process is left behind by the failures.
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let left: Vec<String> = String::from_utf8_lossy(&ps.stdout)
        .lines()
        .filter(|l| l.contains(" mount --mgs") && l.contains(a.to_str().unwrap()))
        .map(String::from)
        .collect();
    assert!(left.is_empty(), "mount processes left: {left:?}");
}
