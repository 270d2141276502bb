//! `nacre io500`: IO500's phases on any directory (`--api posix`, tasks as threads doing
//! POSIX IO: a Nacre mount, ext4, any other file system) or on Nacre through its client
//! library (`--api native`). On Nacre the phase directories get the layouts of the Helma
//! run (io500.sh's `lfs setstripe` / `setdirstripe`), each overridable in `--config`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use nacre_bench::io500::native::Native;
use nacre_bench::io500::report::{Run, compare};
use nacre_bench::io500::{self, Io500Options, Io500Report, NacreLayouts, Posix, Storage, WithLayouts};
use nacre_client::{FileSystem, MountOptions};
use nacre_net::nid::{Nid, NidList};
use nacre_proto::mgs::TargetKind;
use serde::Deserialize;

use crate::service::CliResult;
use crate::size::parse_size;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Api {
    /// POSIX calls on a directory of any mounted file system.
    Posix,
    /// Nacre through `nacre-client`, no FUSE.
    Native,
}

#[derive(Args, Clone, Debug)]
pub struct Io500Args {
    #[arg(long, value_enum, default_value_t = Api::Posix)]
    pub api: Api,
    /// Where to run: a directory (posix); for native, a directory in a Nacre mount of this
    /// machine, or with --mgs the path inside the file system (`/` or `/a/b`).
    #[arg(long)]
    pub dir: PathBuf,
    /// The MGS of the file system (native without a local mount).
    #[arg(long)]
    pub mgs: Option<Nid>,
    /// Tasks (threads), each an IO500 rank (default 4).
    #[arg(long)]
    pub tasks: Option<usize>,
    /// Seconds each write phase runs (IO500's rules: 300).
    #[arg(long)]
    pub stonewall: Option<f64>,
    /// Most bytes a task writes in ior-easy.
    #[arg(long, value_parser = parse_size)]
    pub ior_easy_size: Option<u64>,
    /// ior-easy's transfer size.
    #[arg(long, value_parser = parse_size)]
    pub ior_easy_transfer: Option<u64>,
    /// Most 47,008-byte segments a task writes in ior-hard.
    #[arg(long)]
    pub ior_hard_segments: Option<u64>,
    /// Most files a task makes in mdtest-easy.
    #[arg(long)]
    pub mdtest_easy_files: Option<u64>,
    /// Most files a task makes in mdtest-hard.
    #[arg(long)]
    pub mdtest_hard_files: Option<u64>,
    /// Drop the page cache between phases, as io500.sh's clean_cache (root).
    #[arg(long)]
    pub drop_caches: bool,
    /// A TOML file of settings (the options above, and `[layouts]`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Leave the run's files in place (to look at them after a failure).
    #[arg(long)]
    pub keep: bool,
    /// Also write the figures and settings, as JSON, to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Run the same phases, with the same sizes, on another folder after this one (a
    /// local file system, a FUSE passthrough mount), as `NAME=DIR`; each phase is printed
    /// beside it with its ratio, and the JSON holds the reference's figures and the
    /// ratios. Repeatable.
    #[arg(long = "reference", value_parser = parse_reference)]
    pub references: Vec<(String, PathBuf)>,
    /// Phases not to run (io500.ini's `run = FALSE`), e.g. `--skip ior-hard-write`: the
    /// phases reading what a skipped one makes go with it; the score is over the others.
    #[arg(long, value_delimiter = ',')]
    pub skip: Vec<String>,
}

/// `--config`: every setting of the command line, and the layouts of the phase
/// directories on Nacre (`lfs setstripe` options; `""` keeps the file system's default).
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct Config {
    tasks: Option<usize>,
    stonewall: Option<f64>,
    ior_easy_size: Option<String>,
    ior_easy_transfer: Option<String>,
    ior_hard_segments: Option<u64>,
    mdtest_easy_files: Option<u64>,
    mdtest_hard_files: Option<u64>,
    drop_caches: Option<bool>,
    #[serde(default)]
    layouts: LayoutsConfig,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct LayoutsConfig {
    ior_easy: Option<String>,
    ior_hard: Option<String>,
    mdtest_easy: Option<String>,
    mdtest_hard: Option<String>,
    /// `setdirstripe -D` options of mdtest-easy / mdtest-hard.
    mdtest_easy_dir: Option<String>,
    mdtest_hard_dir: Option<String>,
}

impl Io500Args {
    /// The run's settings: IO500's, then the config file's, then the command line's.
    pub fn options(&self) -> Res<Io500Options> {
        let cfg: Config = match &self.config {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
                toml::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?
            }
            None => Config::default(),
        };
        let size = |s: &Option<String>| -> Res<Option<u64>> {
            Ok(match s {
                Some(s) => Some(parse_size(s).map_err(|e| format!("config: {e}"))?),
                None => None,
            })
        };
        let mut o = Io500Options::new(self.tasks.or(cfg.tasks).unwrap_or(4));
        if let Some(s) = self.stonewall.or(cfg.stonewall) {
            if !(0.0..=86_400.0).contains(&s) {
                return Err(format!("stonewall {s}: 0 to 86400 seconds").into());
            }
            o.stonewall = Duration::from_secs_f64(s);
        }
        if let Some(b) = self.ior_easy_size.or(size(&cfg.ior_easy_size)?) {
            o.ior_easy_bytes = b;
        }
        if let Some(t) = self.ior_easy_transfer.or(size(&cfg.ior_easy_transfer)?) {
            o.ior_easy_transfer = usize::try_from(t).map_err(|_| "ior-easy transfer too large")?;
        }
        if let Some(n) = self.ior_hard_segments.or(cfg.ior_hard_segments) {
            o.ior_hard_segments = n;
        }
        if let Some(n) = self.mdtest_easy_files.or(cfg.mdtest_easy_files) {
            o.mdtest_easy_files = n;
        }
        if let Some(n) = self.mdtest_hard_files.or(cfg.mdtest_hard_files) {
            o.mdtest_hard_files = n;
        }
        o.drop_caches = self.drop_caches || cfg.drop_caches.unwrap_or(false);
        o.keep = self.keep;
        o.skip = self.skip.clone();
        let l = cfg.layouts;
        o.layouts = NacreLayouts {
            ior_easy: l.ior_easy,
            ior_hard: l.ior_hard,
            mdtest_easy: l.mdtest_easy,
            mdtest_hard: l.mdtest_hard,
            mdtest_easy_dir: l.mdtest_easy_dir,
            mdtest_hard_dir: l.mdtest_hard_dir,
        };
        o.check()?;
        Ok(o)
    }
}

/// A client of a Nacre file system, with the runtime its calls run on.
pub struct NacreClient {
    pub rt: tokio::runtime::Runtime,
    pub fs: FileSystem,
}

impl NacreClient {
    pub fn mount(mgs: &NidList) -> Res<NacreClient> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let fs = rt.block_on(FileSystem::mount(mgs, MountOptions::default())).map_err(|e| format!("{mgs}: {e}"))?;
        Ok(NacreClient { rt, fs })
    }

    /// The library's view of `root` (a path inside the file system).
    pub fn native(&self, root: &str) -> Res<Native> {
        Ok(Native::new(self.fs.clone(), self.rt.handle().clone(), root)?)
    }
}

impl Drop for NacreClient {
    fn drop(&mut self) {
        self.rt.block_on(self.fs.unmount());
    }
}

/// Where a run goes: the storage, and the Nacre client behind it if any.
pub struct Target {
    pub storage: Box<dyn Storage>,
    /// The Nacre client behind the storage, if any: it keeps the storage's file system
    /// mounted, and tells each target's free space.
    pub client: Option<NacreClient>,
}

impl Target {
    /// `dir` through `api`; on a Nacre mount (or natively) with layout control.
    pub fn open(api: Api, dir: &Path, mgs: Option<&Nid>) -> Res<Target> {
        let on_nacre = crate::fsys::mount_of(dir).ok();
        match api {
            Api::Posix => {
                let posix = Posix::new(dir)?;
                let Some((point, mgs)) = on_nacre else {
                    return Ok(Target { storage: Box::new(posix), client: None });
                };
                let rel = crate::fsys::inside(dir, &point)?;
                let client = NacreClient::mount(&mgs)?;
                let layouts = client.native(&rel)?;
                Ok(Target { storage: Box::new(WithLayouts { io: posix, layouts }), client: Some(client) })
            }
            Api::Native => {
                let (mgs, rel) = match (mgs, on_nacre) {
                    (Some(m), _) => (NidList::from(m), dir.to_string_lossy().into_owned()),
                    (None, Some((point, m))) => (m, crate::fsys::inside(dir, &point)?),
                    (None, None) => {
                        return Err(format!(
                            "{}: not on a Nacre mount of this machine; give --mgs and the path inside the file system",
                            dir.display()
                        )
                        .into());
                    }
                };
                let client = NacreClient::mount(&mgs)?;
                let native = client.native(&rel)?;
                Ok(Target { storage: Box::new(native), client: Some(client) })
            }
        }
    }
}

/// Free space where a run writes: on Nacre each target's, else the file system's.
#[derive(Debug, Clone, PartialEq)]
pub enum Room {
    Nacre { osts: Vec<(String, u64)>, mdts: Vec<(String, u64)> },
    Folder { free: u64 },
}

/// Shares of the free space a run may plan to fill: ior-easy half of each OST (or of the
/// folder), ior-hard a quarter of all, mdtest-easy and mdtest-hard a quarter of the MDTs'
/// each; the rest is slack for allocation grain and metadata.
const EASY_SHARE: f64 = 0.5;
const HARD_SHARE: f64 = 0.25;
const MDTEST_SHARE: f64 = 0.25;
/// MDT bytes an mdtest file takes, measured through the mount with `nacre df` (3,000 empty
/// files and 3,000 of 3,901 bytes on DoM took 21.5 MiB), rounded up.
const MDTEST_EASY_FILE_BYTES: u64 = 4 << 10;
const MDTEST_HARD_FILE_BYTES: u64 = 8 << 10;
/// Host bytes of an mdtest-hard file on a local file system (a 4 KiB block and its inode).
const LOCAL_FILE_BYTES: u64 = 8 << 10;

impl Target {
    /// The free space the run will meet.
    pub fn room(&self, dir: &Path) -> Res<Room> {
        match &self.client {
            Some(c) => {
                let s = c.rt.block_on(c.fs.statfs(&nacre_client::process_creds()))?;
                let of = |k: TargetKind| -> Vec<(String, u64)> {
                    s.targets.iter().filter(|t| t.kind == k).map(|t| (t.name.clone(), t.bytes_free)).collect()
                };
                Ok(Room::Nacre { osts: of(TargetKind::Ost), mdts: of(TargetKind::Mdt) })
            }
            None => Ok(Room::Folder { free: crate::fsys::host_free(dir)? }),
        }
    }
}

/// Scale `o`'s sizes down to what `room` holds, saying what changed and why. On Nacre,
/// ior-easy's files each land on one OST (io500.sh's `-c 1`, unless `[layouts]` changes
/// it), so each task's share is bounded by the fullest OST and the tasks sharing it.
pub fn fit(o: &mut Io500Options, room: &Room) -> Vec<String> {
    let mut notes = Vec::new();
    let tasks = o.tasks as u64;
    let (easy_room, hard_room, md_room, where_) = match room {
        Room::Nacre { osts, mdts } => {
            let total: u64 = osts.iter().map(|(_, f)| f).sum();
            let fullest = osts.iter().map(|(_, f)| *f).min().unwrap_or(0);
            let per_task = if o.layouts.ior_easy.is_none() && !osts.is_empty() {
                fullest / tasks.div_ceil(osts.len() as u64)
            } else {
                total / tasks
            };
            let md: u64 = mdts.iter().map(|(_, f)| f).sum();
            (per_task, total, Some(md), "the OSTs")
        }
        Room::Folder { free } => (free / tasks, *free, None, "the folder's file system"),
    };
    let easy_cap = ((easy_room as f64 * EASY_SHARE) as u64) / o.ior_easy_transfer as u64 * o.ior_easy_transfer as u64;
    if o.ior_easy_bytes > easy_cap {
        notes.push(format!(
            "ior-easy: at most {} per task instead of {} (--ior-easy-size), to fit {}",
            crate::up::human(easy_cap),
            crate::up::human(o.ior_easy_bytes),
            where_
        ));
        o.ior_easy_bytes = easy_cap.max(o.ior_easy_transfer as u64);
    }
    let segment = (io500::IOR_HARD_TRANSFER as u64) * tasks;
    let hard_cap = ((hard_room as f64 * HARD_SHARE) as u64 / segment).max(1);
    if o.ior_hard_segments > hard_cap {
        notes.push(format!(
            "ior-hard: at most {hard_cap} segments instead of {} (--ior-hard-segments), to fit {where_}",
            o.ior_hard_segments
        ));
        o.ior_hard_segments = hard_cap;
    }
    let (md_free, easy_bytes, hard_bytes, md_where) = match md_room {
        Some(md) => (md, MDTEST_EASY_FILE_BYTES, MDTEST_HARD_FILE_BYTES, "the MDTs"),
        None => (hard_room, LOCAL_FILE_BYTES, LOCAL_FILE_BYTES, where_),
    };
    let md_budget = (md_free as f64 * MDTEST_SHARE) as u64 / tasks;
    for (phase, option, files, each) in [
        ("mdtest-easy", "--mdtest-easy-files", &mut o.mdtest_easy_files, easy_bytes),
        ("mdtest-hard", "--mdtest-hard-files", &mut o.mdtest_hard_files, hard_bytes),
    ] {
        let cap = (md_budget / each).max(1);
        if *files > cap {
            notes.push(format!(
                "{phase}: at most {cap} files per task instead of {files} ({option}), to fit {md_where}"
            ));
            *files = cap;
        }
    }
    notes
}

/// The option that sizes what `phase` writes.
fn option_of(phase: &str) -> Option<&'static str> {
    Some(match phase {
        "ior-easy-write" => "--ior-easy-size",
        "ior-hard-write" => "--ior-hard-segments",
        "mdtest-easy-write" => "--mdtest-easy-files",
        "mdtest-hard-write" => "--mdtest-hard-files",
        _ => return None,
    })
}

/// An ENOSPC in a phase, with the target that filled and the option to change.
fn explain_full(e: &std::io::Error, room: Option<Room>) -> String {
    let text = e.to_string();
    let phase = text.split(':').next().unwrap_or("");
    let full = match room {
        Some(Room::Nacre { osts, mdts }) => {
            let md = phase.starts_with("mdtest");
            let list = if md { &mdts } else { &osts };
            list.iter().min_by_key(|(_, f)| *f).map(|(n, f)| format!("{n} ({} free)", crate::up::human(*f)))
        }
        Some(Room::Folder { free }) => Some(format!("the folder's file system ({} free)", crate::up::human(free))),
        None => None,
    };
    format!(
        "{text}: {} filled{}",
        full.unwrap_or_else(|| "a target".into()),
        option_of(phase).map(|o| format!("; a smaller {o} fits")).unwrap_or_default()
    )
}

/// Run IO500 on `t` with `o`, scaled to the free space of `dir`, printing the header, the
/// `[RESULT]` lines and the score.
pub fn run_on(t: &Target, o: &Io500Options, dir: &Path, what: &str) -> Res<Io500Report> {
    let mut o = o.clone();
    for note in fit(&mut o, &t.room(dir)?) {
        println!("scaled to fit: {note}");
    }
    let mut out = std::io::stdout();
    writeln!(
        out,
        "IO500 phases (ISC25 standard list) on {what}: api {}, {} tasks, stonewall {} s",
        t.storage.api(),
        o.tasks,
        o.stonewall.as_secs_f64()
    )?;
    let report = io500::run(t.storage.as_ref(), &o, &mut out).map_err(|e| {
        let e = if e.kind() == std::io::ErrorKind::StorageFull {
            explain_full(&e, t.room(dir).ok())
        } else {
            e.to_string()
        };
        format!("io500 on {what}: {e}")
    })?;
    for (d, l) in &report.layouts {
        writeln!(out, "  layout of {d}: {l}")?;
    }
    Ok(report)
}

/// `--reference NAME=DIR`.
fn parse_reference(s: &str) -> Result<(String, PathBuf), String> {
    let (name, dir) = s.split_once('=').ok_or_else(|| format!("--reference {s}: NAME=DIR"))?;
    if name.is_empty() || name == "run" || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(format!("--reference {s}: a name of letters, digits, _ and -, other than `run`"));
    }
    if dir.is_empty() {
        return Err(format!("--reference {s}: no folder"));
    }
    Ok((name.to_string(), PathBuf::from(dir)))
}

pub fn io500(a: Io500Args) -> CliResult {
    let mut o = a.options()?;
    let t = Target::open(a.api, &a.dir, a.mgs.as_ref())?;
    let mut refs = Vec::new();
    for (i, (name, dir)) in a.references.iter().enumerate() {
        if a.references[..i].iter().any(|(n, _)| n == name) {
            return Err(format!("--reference {name}: named twice").into());
        }
        refs.push((name.as_str(), dir, Target::open(Api::Posix, dir, None)?));
    }
    // One set of sizes for every run, so that the figures compare: what fits everywhere.
    if !refs.is_empty() {
        for (dir, r) in std::iter::once((&a.dir, &t)).chain(refs.iter().map(|(_, d, r)| (*d, r))) {
            for note in fit(&mut o, &r.room(dir)?) {
                println!("scaled to fit {}: {note}", dir.display());
            }
        }
    }
    let report = run_on(&t, &o, &a.dir, &a.dir.display().to_string())?;
    let mut j = report.json();
    j["dir"] = a.dir.display().to_string().into();
    if !refs.is_empty() {
        let mut reports = Vec::new();
        for (name, dir, r) in &refs {
            println!("\n== reference {name}: {}", dir.display());
            reports.push((*name, run_on(r, &o, dir, &format!("reference {name} ({})", dir.display()))?));
        }
        let mut runs: Vec<Run<'_>> = vec![("run", &report.results[..], &report.score)];
        runs.extend(reports.iter().map(|(n, r)| (*n, &r.results[..], &r.score)));
        let pairs: Vec<(&str, &str)> = reports.iter().map(|(n, _)| ("run", *n)).collect();
        let (table, compared) = compare(&runs, &pairs);
        println!("\n== side by side\n{table}");
        j["references"] = reports
            .iter()
            .zip(&refs)
            .map(|((n, r), (_, dir, _))| {
                let mut v = r.json();
                v["dir"] = dir.display().to_string().into();
                ((*n).to_string(), v)
            })
            .collect::<serde_json::Map<_, _>>()
            .into();
        j["ratios"] = compared["ratios"].clone();
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&j)? + "\n").map_err(|e| format!("{}: {e}", p.display()))?;
    }
    println!("{}", serde_json::to_string(&j)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Io500Options {
        let mut o = Io500Options::new(4);
        o.ior_easy_bytes = 1 << 30;
        o.ior_hard_segments = 10_000;
        o.mdtest_easy_files = 1_000;
        o.mdtest_hard_files = 1_000;
        o
    }

    fn nacre(osts: &[u64], mdt: u64) -> Room {
        Room::Nacre {
            osts: osts.iter().enumerate().map(|(i, f)| (format!("nacre-OST{i:04x}"), *f)).collect(),
            mdts: vec![("nacre-MDT0000".into(), mdt)],
        }
    }

    #[test]
    fn what_fits_is_left_alone() {
        let mut o = options();
        let before = format!("{o:?}");
        assert!(fit(&mut o, &nacre(&[8 << 30; 4], 1 << 30)).is_empty());
        assert_eq!(format!("{o:?}"), before);
    }

    #[test]
    fn ior_easy_is_bounded_by_the_fullest_ost_and_the_tasks_sharing_it() {
        // Four tasks on two OSTs, one nearly full: two tasks may land on it.
        let mut o = options();
        let notes = fit(&mut o, &nacre(&[512 << 20, 100 << 20], 1 << 30));
        // Half of 100 MiB for two tasks, in whole 2 MiB transfers.
        assert_eq!(o.ior_easy_bytes, 24 << 20, "{notes:?}");
        assert!(notes[0].starts_with("ior-easy: at most 24 MiB per task instead of 1.0 GiB (--ior-easy-size)"));
        // ior-hard: a quarter of all the OSTs' space, in segments of four 47,008-byte writes.
        assert_eq!(o.ior_hard_segments, ((612u64 << 20) / 4) / (47_008 * 4));
        // Striped ior-easy (a layout of the config): all the OSTs' space counts.
        let mut o = options();
        o.layouts.ior_easy = Some("-c -1".into());
        fit(&mut o, &nacre(&[512 << 20, 100 << 20], 1 << 30));
        assert_eq!(o.ior_easy_bytes, (612u64 << 20) / 4 / 2 / (2 << 20) * (2 << 20));
    }

    #[test]
    fn mdtest_files_are_bounded_by_the_mdts() {
        let mut o = options();
        let notes = fit(&mut o, &nacre(&[8 << 30], 16 << 20));
        // A quarter of 16 MiB over four tasks: 1 MiB each, 256 empty files, 128 with data.
        assert_eq!((o.mdtest_easy_files, o.mdtest_hard_files), (256, 128), "{notes:?}");
        assert!(notes.iter().any(|n| n.contains("(--mdtest-hard-files), to fit the MDTs")));
    }

    #[test]
    fn a_folder_is_one_space() {
        let mut o = options();
        let notes = fit(&mut o, &Room::Folder { free: 1 << 30 });
        assert_eq!(o.ior_easy_bytes, 128 << 20);
        assert!(notes.iter().all(|n| n.contains("the folder's file system")), "{notes:?}");
        assert!(o.check().is_ok());
    }

    #[test]
    fn a_full_target_is_named_with_the_option_to_change() {
        let e = std::io::Error::new(std::io::ErrorKind::StorageFull, "ior-easy-write: No space left on device");
        let said = explain_full(&e, Some(nacre(&[400 << 20, 3 << 20], 1 << 30)));
        assert!(said.contains("nacre-OST0001 (3 MiB free) filled; a smaller --ior-easy-size fits"), "{said}");
        let e = std::io::Error::new(std::io::ErrorKind::StorageFull, "mdtest-hard-write: No space left on device");
        let said = explain_full(&e, Some(nacre(&[400 << 20], 2 << 20)));
        assert!(said.contains("nacre-MDT0000 (2 MiB free) filled; a smaller --mdtest-hard-files fits"), "{said}");
    }
}
