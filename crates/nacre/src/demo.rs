//! `nacre demo`: Nacre's main job on one machine, measured. Starts a file system on drive
//! files (`nacre up`), mounts it, runs a short IO500 three ways in the same run — through
//! the mount, through the client library, and on a folder of the local file system (and,
//! when given, over libfuse's passthrough example, the FUSE ceiling) — prints the phases
//! side by side with their ratios, stops (`nacre down`), checks nothing is left, and ends
//! with one JSON line.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use nacre_bench::io500::report::{Run, compare};
use nacre_bench::io500::{Io500Options, Io500Report};
use serde_json::json;

use crate::io500::{Api, Target, run_on};
use crate::service::CliResult;
use crate::size::parse_size;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Args, Clone, Debug)]
pub struct DemoArgs {
    /// Working folder: drive files, the mount point, the local reference folder (made,
    /// and removed at the end; an existing folder only if an earlier demo made it).
    #[arg(long, default_value = "/tmp/nacre-demo")]
    pub work: PathBuf,
    /// IO500 tasks (threads).
    #[arg(long, default_value_t = 4)]
    pub tasks: usize,
    /// Seconds each write phase runs.
    #[arg(long, default_value_t = 20.0)]
    pub stonewall: f64,
    /// Most bytes a task writes in ior-easy.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub ior_easy_size: u64,
    /// Most 47,008-byte segments a task writes in ior-hard.
    #[arg(long, default_value_t = 2000)]
    pub ior_hard_segments: u64,
    /// Most files a task makes in mdtest-easy. The file counts keep the whole tree under
    /// the 20,000 descriptors libfuse's passthrough may hold on machines like this one (it
    /// keeps one per inode the kernel knows).
    #[arg(long, default_value_t = 2_500)]
    pub mdtest_easy_files: u64,
    /// Most files a task makes in mdtest-hard (their data is on the MDT).
    #[arg(long, default_value_t = 2_000)]
    pub mdtest_hard_files: u64,
    /// Object data each OST holds.
    #[arg(long, default_value = "2G", value_parser = parse_size)]
    pub ost_size: u64,
    /// Bytes of each of the MDT's four drives.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub mdt_size: u64,
    /// TCP port of the MGS.
    #[arg(long, default_value_t = 9400)]
    pub port: u16,
    /// libfuse's passthrough_ll, built (`scripts/ref/fuse-ceiling.sh` builds it): the
    /// phases also run over it, mounted on a folder of the local file system.
    #[arg(long)]
    pub passthrough: Option<PathBuf>,
}

/// Runs `nacre down` and removes the working folder when dropped, however the demo ends.
struct Cleanup {
    exe: PathBuf,
    work: PathBuf,
    passthrough: Option<(Child, PathBuf)>,
}

/// The file that marks a working folder as the demo's own: only such a folder is removed.
const MARK: &str = ".nacre-demo";

impl Cleanup {
    fn stop(&mut self) -> Res<()> {
        if let Some((mut child, mnt)) = self.passthrough.take() {
            let _ = crate::fsys::unmount(&mnt, false);
            let _ = child.kill();
            let _ = child.wait();
        }
        let data = self.work.join("data");
        if data.join("nacre.conf").exists() {
            let st = Command::new(&self.exe).arg("down").arg("--data").arg(&data).stdout(Stdio::null()).status()?;
            if !st.success() {
                return Err("nacre down failed".into());
            }
        }
        if self.work.exists() {
            if !self.work.join(MARK).exists() {
                return Err(format!(
                    "{} exists and was not made by nacre demo: give --work a new folder",
                    self.work.display()
                )
                .into());
            }
            std::fs::remove_dir_all(&self.work).map_err(|e| format!("{}: {e}", self.work.display()))?;
        }
        Ok(())
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Mount libfuse's passthrough example `bin` over `src` on `mnt`.
fn passthrough(bin: &Path, src: &Path, mnt: &Path) -> Res<Child> {
    std::fs::create_dir_all(src)?;
    std::fs::create_dir_all(mnt)?;
    let mut cmd = Command::new(bin);
    // passthrough_ll holds a descriptor for every inode the kernel knows: mdtest's files
    // pass the usual limits at once.
    // SAFETY: only setrlimit between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            // Root may go past the hard limit (to fs.nr_open's default); else the hard limit.
            let big = libc::rlimit { rlim_cur: 1 << 20, rlim_max: 1 << 20 };
            let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &big) != 0 && libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
                l.rlim_cur = l.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            }
            Ok(())
        });
    }
    let mut child = cmd
        .arg("-f")
        .arg("-o")
        .arg(format!("source={}", src.display()))
        .arg(mnt)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let until = Instant::now() + Duration::from_secs(10);
    while !crate::fsys::is_mounted(mnt) {
        if Instant::now() > until || child.try_wait()?.is_some() {
            let _ = child.kill();
            return Err(format!("{} did not mount on {}", bin.display(), mnt.display()).into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child)
}

/// Entries left in `dir`.
fn leftovers(dir: &Path) -> Res<usize> {
    Ok(std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?.count())
}

pub fn demo(a: DemoArgs) -> CliResult {
    if let Some(bin) = &a.passthrough
        && !bin.is_file()
    {
        return Err(format!(
            "--passthrough {}: no such program (scripts/ref/fuse-ceiling.sh builds it)",
            bin.display()
        )
        .into());
    }
    let exe = std::env::current_exe()?;
    let (work, data, mnt, local) = (a.work.clone(), a.work.join("data"), a.work.join("mnt"), a.work.join("local"));
    // What an earlier demo left.
    let mut cleanup = Cleanup { exe: exe.clone(), work: work.clone(), passthrough: None };
    cleanup.stop()?;
    std::fs::create_dir_all(&work)?;
    std::fs::write(work.join(MARK), "made by nacre demo; removed when it ends\n")?;
    std::fs::create_dir_all(&mnt)?;
    std::fs::create_dir_all(&local)?;

    let mut o = Io500Options::new(a.tasks);
    o.stonewall = Duration::from_secs_f64(a.stonewall.clamp(0.0, 3600.0));
    o.ior_easy_bytes = a.ior_easy_size;
    o.ior_hard_segments = a.ior_hard_segments;
    o.mdtest_easy_files = a.mdtest_easy_files;
    o.mdtest_hard_files = a.mdtest_hard_files;
    // SAFETY: geteuid cannot fail.
    o.drop_caches = unsafe { libc::geteuid() } == 0;
    o.progress = true;
    o.check()?;

    println!("== nacre up: MGS, one MDT on RAID10, four OSTs on RAID6 8+2, drive files in {}", data.display());
    let st = Command::new(&exe)
        .arg("up")
        .arg("--data")
        .arg(&data)
        .arg("--mount")
        .arg(&mnt)
        .arg("--ost-size")
        .arg(a.ost_size.to_string())
        .arg("--mdt-size")
        .arg(a.mdt_size.to_string())
        .arg("--port")
        .arg(a.port.to_string())
        .status()?;
    if !st.success() {
        return Err("nacre up failed".into());
    }
    if let Some(bin) = &a.passthrough {
        let pt = work.join("pt");
        cleanup.passthrough = Some((passthrough(bin, &work.join("pt-src"), &pt)?, pt));
    }

    let mut runs: Vec<(&str, String, Io500Report)> = Vec::new();
    let mut sides: Vec<(&str, &str, Api, PathBuf)> = vec![
        ("mount", "the Nacre mount", Api::Posix, mnt.clone()),
        ("native", "Nacre through nacre-client", Api::Native, mnt.clone()),
        ("local", "the local file system", Api::Posix, local.clone()),
    ];
    if a.passthrough.is_some() {
        sides.push(("passthrough", "libfuse passthrough_ll over the local file system", Api::Posix, work.join("pt")));
    }
    for (key, what, api, dir) in sides {
        println!("\n== IO500 on {what} ({})", dir.display());
        let t = Target::open(api, &dir, None)?;
        o.run_dir = format!("io500-{key}");
        let report = run_on(&t, &o, &dir, what)?;
        runs.push((key, what.to_string(), report));
    }

    println!("\n== side by side ({} tasks, stonewall {} s, {} cores)", a.tasks, a.stonewall, cores());
    let mut pairs = vec![("mount", "local"), ("native", "local")];
    if runs.iter().any(|r| r.0 == "passthrough") {
        pairs.push(("mount", "passthrough"));
    }
    let listed: Vec<Run<'_>> = runs.iter().map(|(k, _, r)| (*k, &r.results[..], &r.score)).collect();
    let (table, compared) = compare(&listed, &pairs);
    print!("{table}");
    let score = |key: &str| runs.iter().find(|r| r.0 == key).map_or(0.0, |r| r.2.score.total);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };

    // Every run removed its files: the folders are empty before the file system stops.
    let left_mount = leftovers(&mnt)?;
    let left_local = leftovers(&local)?;
    println!("\n== nacre down");
    cleanup.stop()?;
    let gone = !work.exists();
    println!(
        "left behind: {left_mount} entries in the mount, {left_local} in the local folder; {} {}",
        work.display(),
        if gone { "removed" } else { "still there" }
    );
    if left_mount + left_local > 0 || !gone {
        return Err("the demo left files behind".into());
    }

    let mut j = json!({
        "job": "demo",
        "tasks": a.tasks,
        "stonewall_s": a.stonewall,
        "cores": cores(),
        "phases": compared["phases"],
        "ratios": compared["ratios"],
        "score_mount": score("mount"),
        "score_native": score("native"),
        "score_local": score("local"),
        "ratio_mount": ratio(score("mount"), score("local")),
        "ratio_native": ratio(score("native"), score("local")),
        "left_behind": 0,
    });
    if pairs.len() > 2 {
        j["score_passthrough"] = json!(score("passthrough"));
        j["ratio_mount_passthrough"] = json!(ratio(score("mount"), score("passthrough")));
    }
    for (k, _, r) in &runs {
        j[format!("bw_{k}")] = json!(r.score.bandwidth);
        j[format!("md_{k}")] = json!(r.score.iops);
    }
    println!("{}", serde_json::to_string(&j)?);
    Ok(())
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
