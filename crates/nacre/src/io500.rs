//! `nacre io500`: IO500's phases on any directory (`--api posix`, tasks as threads doing
//! POSIX IO: a Nacre mount, ext4, any other file system) or on Nacre through its client
//! library (`--api native`). On Nacre the phase directories get the layouts of the Helma
//! run (io500.sh's `lfs setstripe` / `setdirstripe`), each overridable in `--config`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use nacre_bench::io500::native::Native;
use nacre_bench::io500::{self, Io500Options, Io500Report, NacreLayouts, Posix, Storage, WithLayouts};
use nacre_client::{FileSystem, MountOptions};
use nacre_net::nid::Nid;
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
    pub fn mount(mgs: &Nid) -> Res<NacreClient> {
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
    pub _client: Option<NacreClient>,
}

impl Target {
    /// `dir` through `api`; on a Nacre mount (or natively) with layout control.
    pub fn open(api: Api, dir: &Path, mgs: Option<&Nid>) -> Res<Target> {
        let on_nacre = crate::fsys::mount_of(dir).ok();
        match api {
            Api::Posix => {
                let posix = Posix::new(dir)?;
                let Some((point, mgs)) = on_nacre else {
                    return Ok(Target { storage: Box::new(posix), _client: None });
                };
                let rel = crate::fsys::inside(dir, &point)?;
                let client = NacreClient::mount(&mgs)?;
                let layouts = client.native(&rel)?;
                Ok(Target { storage: Box::new(WithLayouts { io: posix, layouts }), _client: Some(client) })
            }
            Api::Native => {
                let (mgs, rel) = match (mgs, on_nacre) {
                    (Some(m), _) => (m.clone(), dir.to_string_lossy().into_owned()),
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
                Ok(Target { storage: Box::new(native), _client: Some(client) })
            }
        }
    }
}

/// Run IO500 on `t` with `o`, printing the header, the `[RESULT]` lines and the score.
pub fn run_on(t: &Target, o: &Io500Options, what: &str) -> Res<Io500Report> {
    let mut out = std::io::stdout();
    writeln!(
        out,
        "IO500 phases (ISC25 standard list) on {what}: api {}, {} tasks, stonewall {} s",
        t.storage.api(),
        o.tasks,
        o.stonewall.as_secs_f64()
    )?;
    let report = io500::run(t.storage.as_ref(), o, &mut out).map_err(|e| format!("io500 on {what}: {e}"))?;
    for (d, l) in &report.layouts {
        writeln!(out, "  layout of {d}: {l}")?;
    }
    Ok(report)
}

pub fn io500(a: Io500Args) -> CliResult {
    let o = a.options()?;
    let t = Target::open(a.api, &a.dir, a.mgs.as_ref())?;
    let report = run_on(&t, &o, &a.dir.display().to_string())?;
    let mut j = report.json();
    j["dir"] = a.dir.display().to_string().into();
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&j)? + "\n").map_err(|e| format!("{}: {e}", p.display()))?;
    }
    println!("{}", serde_json::to_string(&j)?);
    Ok(())
}
