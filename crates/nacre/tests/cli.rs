//! The `nacre raid` command line: a whole life cycle, and every refusal. A refusal must
//! name the problem and leave the drives exactly as they were.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn nacre(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nacre")).args(args).output().expect("run nacre")
}

fn ok(args: &[&str]) -> String {
    let out = nacre(args);
    assert!(out.status.success(), "nacre {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Run a command that must fail; returns its error text.
fn refused(args: &[&str]) -> String {
    let out = nacre(args);
    assert!(!out.status.success(), "nacre {args:?} should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

struct Tmp(PathBuf);

impl Tmp {
    fn new(name: &str) -> Tmp {
        let p = std::env::temp_dir().join(format!("nacre-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Tmp(p)
    }
    fn s(&self, rel: &str) -> String {
        self.0.join(rel).display().to_string()
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn make_file(p: &str, size: u64) {
    std::fs::File::create(p).unwrap().set_len(size).unwrap();
}

fn digest(paths: &[String]) -> Vec<u64> {
    paths
        .iter()
        .map(|p| {
            let b = std::fs::read(p).unwrap();
            b.iter().fold(0xcbf29ce484222325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100000001b3))
        })
        .collect()
}

#[test]
fn life_cycle_create_show_fail_replace_scrub() {
    let t = Tmp::new("life");
    let dir = t.s("drives");
    let out = ok(&[
        "raid", "create", "--name", "ost0", "--level", "6", "--strip", "16K", "--dir", &dir, "--count", "6", "--size",
        "8M",
    ]);
    assert!(out.contains("level: 6") && out.contains("strip_size: 16") && out.contains("online"), "{out}");
    let paths: Vec<String> = files(Path::new(&dir)).iter().map(|f| format!("{dir}/{f}")).collect();
    let before = digest(&paths);
    let show = ok(&["raid", "show", "--dir", &dir]);
    assert!(show.contains("ost0") && show.contains("5 ") && show.contains("data/parity: 4+2"), "{show}");
    assert_eq!(digest(&paths), before, "show must not write to the drives");
    let out = ok(&["raid", "fail", "--dir", &dir, "--slot", "2"]);
    assert!(out.contains("degraded"), "{out}");
    // The failed drive is still in the folder: assembly refuses it as stale.
    let show = ok(&["raid", "show", "--dir", &dir]);
    assert!(show.contains("degraded") && show.contains("is stale") && show.contains("marked failed"), "{show}");
    let e = refused(&["raid", "replace", "--dir", &dir, "--slot", "1", "--new", &t.s("spare"), "--size", "8M"]);
    assert!(e.contains("slot 1 is online") && e.contains("failed slot"), "{e}");
    let out = ok(&["raid", "replace", "--dir", &dir, "--slot", "2", "--new", &t.s("spare"), "--size", "8M"]);
    assert!(out.contains("rebuilding slot 2: done"), "{out}");
    let drives = format!(
        "{},{}",
        files(Path::new(&dir)).iter().map(|f| format!("{dir}/{f}")).collect::<Vec<_>>().join(","),
        t.s("spare")
    );
    let show = ok(&["raid", "show", "--drives", &drives, "--name", "ost0"]);
    assert!(show.contains("║ online") && show.contains("spare online"), "{show}");
    let out = ok(&["raid", "scrub", "--drives", &drives, "--name", "ost0", "--check-only"]);
    assert!(out.contains("0 with mismatched parity"), "{out}");
}

#[test]
fn bad_create_input_is_refused_and_writes_nothing() {
    let t = Tmp::new("bad");
    let dir = t.s("new");
    let cases: &[(&[&str], &str)] = &[
        (&["--level", "6", "--count", "3"], "level 6 needs at least 4, got 3 drive(s)"),
        (&["--level", "10", "--count", "3"], "level 10 needs a multiple of the group size 2"),
        (&["--level", "5", "--count", "4", "--strip", "12K"], "strip size 12288 bytes is not a power of two"),
        (&["--level", "5", "--count", "4", "--strip", "2M"], "not a power of two between 4 KiB and 1 MiB"),
        (&["--level", "7", "--count", "4"], "unknown level \"7\""),
        (&["--level", "8+5", "--count", "13"], "M between 1 and 4"),
    ];
    for (extra, msg) in cases {
        let mut args = vec!["raid", "create", "--name", "v", "--dir", &dir, "--size", "4M"];
        args.extend_from_slice(extra);
        let e = refused(&args);
        assert!(e.contains(msg), "{extra:?}: expected {msg:?} in {e:?}");
        assert!(files(Path::new(&dir)).is_empty(), "{extra:?} left files behind");
    }
    let e = refused(&[
        "raid",
        "create",
        "--name",
        "bad name!",
        "--level",
        "1",
        "--dir",
        &dir,
        "--count",
        "2",
        "--size",
        "4M",
    ]);
    assert!(e.contains("bad volume name"), "{e}");

    // Existing drives: unequal sizes, a missing file, a duplicate, one already in use.
    let d: Vec<String> = (0..4).map(|i| t.s(&format!("d{i}"))).collect();
    for p in &d[..3] {
        make_file(p, 4 << 20);
    }
    make_file(&d[3], 5 << 20);
    let before = digest(&d);
    let e = refused(&["raid", "create", "--name", "v", "--level", "5", "--drives", &d.join(",")]);
    assert!(e.contains("drives differ in size"), "{e}");
    assert_eq!(digest(&d), before, "a refused create wrote to the drives");
    let missing = format!("{},{},{}", d[0], d[1], t.s("nope"));
    let e = refused(&["raid", "create", "--name", "v", "--level", "5", "--drives", &missing]);
    assert!(e.contains("nope does not exist"), "{e}");
    let dup = format!("{},{},{}", d[0], d[1], d[0]);
    let e = refused(&["raid", "create", "--name", "v", "--level", "5", "--drives", &dup]);
    assert!(e.contains("is listed twice"), "{e}");
    assert_eq!(digest(&d), before);
    let three = d[..3].join(",");
    ok(&["raid", "create", "--name", "first", "--level", "5", "--strip", "4K", "--drives", &three, "--assume-clean"]);
    let used = digest(&d[..3]);
    let e = refused(&["raid", "create", "--name", "second", "--level", "1", "--drives", &format!("{},{}", d[0], d[1])]);
    assert!(e.contains("already belongs to volume 'first'"), "{e}");
    assert_eq!(digest(&d[..3]), used, "refused create touched a drive in use");
    make_file(&t.s("v-d1"), 4 << 20);
    let e = refused(&[
        "raid",
        "create",
        "--name",
        "v",
        "--level",
        "5",
        "--dir",
        &t.0.display().to_string(),
        "--count",
        "3",
        "--size",
        "4M",
    ]);
    assert!(e.contains("v-d1 already exists"), "{e}");
    assert!(!Path::new(&t.s("v-d0")).exists(), "a refused create left a drive file");
}

#[test]
fn bad_repair_input_is_refused() {
    let t = Tmp::new("repair");
    let dir = t.s("drives");
    ok(&[
        "raid", "create", "--name", "mdt0", "--level", "10", "--strip", "16K", "--dir", &dir, "--count", "4", "--size",
        "4M",
    ]);
    let paths: Vec<String> = files(Path::new(&dir)).iter().map(|f| format!("{dir}/{f}")).collect();
    let before = digest(&paths);
    let e = refused(&["raid", "fail", "--dir", &dir, "--slot", "9"]);
    assert!(e.contains("slot 9 does not exist"), "{e}");
    let e = refused(&["raid", "replace", "--dir", &dir, "--slot", "0", "--new", &t.s("x"), "--recon-prio", "0"]);
    assert!(e.contains("--recon-prio 0 is not within 1..=100"), "{e}");
    assert_eq!(digest(&paths), before, "refusals wrote to the drives");
    ok(&["raid", "fail", "--dir", &dir, "--slot", "0"]);
    let e = refused(&["raid", "fail", "--dir", &dir, "--slot", "1"]);
    assert!(e.contains("would take volume 'mdt0' offline"), "{e}");
    let e = refused(&["raid", "replace", "--dir", &dir, "--slot", "0", "--new", &t.s("missing")]);
    assert!(e.contains("does not exist"), "{e}");
    make_file(&t.s("small"), 1 << 20);
    let e = refused(&["raid", "replace", "--dir", &dir, "--slot", "0", "--new", &t.s("small")]);
    assert!(e.contains("is too small"), "{e}");
    let e = refused(&["raid", "show", "--dir", &dir, "--name", "other"]);
    assert!(e.contains("no volume named 'other'"), "{e}");
    let e = refused(&["raid", "show", "--dir", &t.s("nowhere")]);
    assert!(e.contains("cannot read folder"), "{e}");
}
