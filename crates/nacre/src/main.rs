//! `nacre`: one command for everything Nacre does. Today: software RAID volumes
//! (`nacre raid …`) and their benchmarks, and the transport selftest (`nacre net …`); the
//! file system's services join as they land.

mod bench;
mod demo;
mod failover;
mod fsys;
mod ha;
mod heap;
mod io500;
mod mdt;
mod mgs;
mod net;
mod ost;
mod raid;
mod service;
mod size;
mod storm;
mod up;

use clap::{CommandFactory, Parser, Subcommand};
use nacre_net::nid::NidList;

/// mimalloc, counting the heap's growth when `nacre bench mdt` asks.
#[global_allocator]
static ALLOCATOR: heap::Counting = heap::Counting;

/// `nacre --version`: the package version and the commit it was built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("NACRE_COMMIT"), ")");

#[derive(Parser)]
#[command(name = "nacre", version = VERSION, about = "Nacre: a parallel file system in user space")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Software RAID volumes over drives (files or block devices).
    #[command(subcommand)]
    Raid(raid::RaidCommand),
    /// The transport: selftest against plain sockets.
    #[command(subcommand)]
    Net(net::NetCommand),
    /// Object storage targets on file drives: format, check, stat.
    #[command(subcommand)]
    Ost(ost::OstCommand),
    /// Metadata targets on file drives: format, stat, serve.
    #[command(subcommand)]
    Mdt(mdt::MdtCommand),
    /// The management service of a file system: format, serve.
    #[command(subcommand)]
    Mgs(mgs::MgsCommand),
    /// Print a running service's parameters and statistics whose names match a glob
    /// (`obdfilter.*.brw_stats`), as `lctl get_param` does.
    GetParam {
        /// The service, e.g. 10.0.0.5@tcp:9100 (a failover pair's NIDs separated by
        /// commas, tried in turn); without it, every Nacre mount of this machine (the
        /// client tunables: `osc.*`, `llite.*`).
        #[arg(long)]
        server: Option<NidList>,
        pattern: String,
    },
    /// Set a running service's parameter (`ost.OSS.ost_io.nrs_tbf_rule="start slow
    /// nid={10.0.0.*} rate=100"`, `obdfilter.ost0.job_stats=clear`), as `lctl set_param`.
    SetParam {
        /// The service (NID[,NID…], tried in turn); without it, every Nacre mount of this
        /// machine (with -P: their MGS, at each of its NIDs in turn).
        #[arg(long)]
        server: Option<NidList>,
        /// Store it in the MGS (`--server` is the MGS) for the whole file system, as
        /// `lctl set_param -P`; an empty value removes it.
        #[arg(short = 'P', long = "permanent")]
        permanent: bool,
        /// NAME=VALUE
        setting: String,
    },
    /// Benchmarks of the services' layers (`ost`: the object store, `mds`: metadata served,
    /// `mdt`: the metadata engine alone).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Start a whole file system on this machine (MGS, MDTs, OSTs over drive files in
    /// `--data`), mount it if asked, and return once it serves. Again on the same folder:
    /// the same file system, with its data.
    Up(up::UpArgs),
    /// Stop the file system `up` (or `server`) started in `--data` (and its mount);
    /// returns once stopped.
    Down(up::DownArgs),
    /// Serve one node's share of a file system spread over machines, as a cluster file
    /// says (`--config cluster.toml --node NAME`); returns once serving.
    Server(up::ServerArgs),
    /// Every target of a cluster file: its nodes, the node whose lease holds its drives
    /// and how old its heartbeat is, and where the MGS says it is served.
    Status(ha::StatusArgs),
    /// Move a target of a failover pair to another of its nodes (`--to`, default its other
    /// node): its holder commits, stops serving it and hands its drives over; returns once
    /// the new node holds them.
    Failover(ha::FailoverArgs),
    /// Move every target of a failover pair (or the one named) back to its primary node.
    Failback(ha::FailbackArgs),
    /// Mount a file system from its MGS (FUSE); returns once mounted.
    Mount(fsys::MountArgs),
    /// Unmount a Nacre mount.
    Umount(fsys::PathArg),
    /// Set a directory's default layout or make a file with a layout (`lfs setstripe`).
    Setstripe(fsys::SetstripeArgs),
    /// Show a file's layout and objects, or a directory's default (`lfs getstripe`).
    Getstripe(fsys::PathArg),
    /// Make a directory striped over MDTs, or with -D set the default of new
    /// subdirectories (`lfs setdirstripe`).
    Setdirstripe(fsys::SetdirstripeArgs),
    /// Show a directory's stripes over MDTs and its default (`lfs getdirstripe`).
    Getdirstripe(fsys::PathArg),
    /// Make a directory on a given MDT (`lfs mkdir -i`).
    Mkdir(fsys::MkdirArgs),
    /// Space of every target of the file system holding PATH (`lfs df`).
    Df(fsys::PathArg),
    /// Find files by name, type, size, mtime, stripe count or OST (`lfs find`).
    Find(fsys::FindArgs),
    /// IO500's phases (ISC25 standard list) on a directory of any file system, or on
    /// Nacre natively: `[RESULT]` lines, the `[SCORE ]` line, then one JSON line.
    Io500(io500::Io500Args),
    /// Nacre's main job on this machine: `up` on drive files, a short IO500 through the
    /// mount, through the client library and on the local file system, side by side,
    /// then `down`; ends with one JSON line.
    Demo(demo::DemoArgs),
    /// Print the shell completion script of `nacre` (bash: `nacre completions bash >
    /// /etc/bash_completion.d/nacre`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages: nacre(1) and one per command (nacre-up(1), …) into `--dir`, or
    /// print nacre(1).
    Man {
        /// Folder for the pages (e.g. /usr/local/share/man/man1).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
}

/// `nacre completions SHELL`.
fn completions(shell: clap_complete::Shell) -> Result<(), Box<dyn std::error::Error>> {
    clap_complete::generate(shell, &mut Cli::command(), "nacre", &mut std::io::stdout());
    Ok(())
}

/// `nacre man [--dir DIR]`.
fn man(dir: Option<&std::path::Path>) -> Result<(), Box<dyn std::error::Error>> {
    let cmd = Cli::command();
    match dir {
        None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?,
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            clap_mangen::generate_to(cmd, d).map_err(|e| format!("{}: {e}", d.display()))?;
            let n = std::fs::read_dir(d)?
                .filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "1")))
                .count();
            println!("{n} man pages in {}", d.display());
        }
    }
    Ok(())
}

/// Whether standard output is a pipe whose reader has gone (`nacre … | head` after head
/// exits): the kernel flags its write end with POLLERR.
fn stdout_closed() -> bool {
    let mut p = libc::pollfd { fd: 1, events: libc::POLLOUT, revents: 0 };
    // SAFETY: poll of one descriptor of ours, without waiting.
    unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLERR != 0 }
}

/// End the process as coreutils end when their output is gone: killed by SIGPIPE,
/// quietly.
fn end_by_sigpipe() -> ! {
    // SAFETY: restoring SIGPIPE's default and raising it.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(128 + libc::SIGPIPE)
}

/// A closed pipe on standard output (`nacre get-param … | head`) ends the command quietly.
/// Rust ignores SIGPIPE, so `println!` panics instead; SIGPIPE stays ignored, since the
/// transport writes to sockets with writev, where a peer that went away must be an error
/// on that connection, not the death of the process.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if stdout_closed() {
            end_by_sigpipe();
        }
        default(info);
    }));
}

/// Where a parameter command goes: `--server`, else every local mount's control endpoint
/// (or, for `-P`, their MGSs); and whether they are the local mounts.
fn param_targets(server: Option<NidList>, mgs: bool) -> Result<(Vec<NidList>, bool), Box<dyn std::error::Error>> {
    if let Some(s) = server {
        return Ok((vec![s], false));
    }
    let mounts = fsys::local_mounts()?.into_iter();
    let mut out: Vec<NidList> =
        mounts.filter_map(|(_, m, ctl)| if mgs { Some(m) } else { ctl.map(NidList::from) }).collect();
    out.dedup();
    if out.is_empty() {
        return Err("no --server given and no Nacre mount on this machine".into());
    }
    Ok((out, true))
}

/// How a parameter request failed: the service could not be reached, or it refused.
pub(crate) enum ParamError {
    Unreachable(String),
    Refused(String),
}

impl From<ParamError> for Box<dyn std::error::Error> {
    fn from(e: ParamError) -> Self {
        match e {
            ParamError::Unreachable(m) | ParamError::Refused(m) => m.into(),
        }
    }
}

/// One parameter request to a service; its reply text.
pub(crate) fn call_param(server: &nacre_net::nid::Nid, opcode: u16, body: &[u8]) -> Result<String, ParamError> {
    let unreachable = |e: &dyn std::fmt::Display| ParamError::Unreachable(format!("{server}: {e}"));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| unreachable(&e))?;
    rt.block_on(async {
        let cfg = nacre_net::client::ClientConfig { ping: false, ..Default::default() };
        let client = nacre_net::client::Client::new(std::sync::Arc::new(nacre_net::transport::TcpTransport), cfg);
        let import = client.connect(server).await.map_err(|e| unreachable(&e))?;
        let reply = import.call(opcode, body, &[]).await.map_err(|e| unreachable(&e))?;
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        let _ = import.disconnect().await;
        if reply.header.status != 0 {
            return Err(ParamError::Refused(format!("{server}: {text}")));
        }
        Ok(text)
    })
}

/// [`call_param`] to the first of `server`'s NIDs that can be reached (a failover MGS's
/// list, in turn).
pub(crate) fn call_param_any(server: &NidList, opcode: u16, body: &[u8]) -> Result<String, ParamError> {
    let mut last = String::new();
    for nid in server.all() {
        match call_param(nid, opcode, body) {
            Err(ParamError::Unreachable(why)) => last = why,
            answered => return answered,
        }
    }
    Err(ParamError::Unreachable(last))
}

/// Send one parameter request to each of `targets`; their reply texts. Among the local
/// mounts (`local`), one that cannot be reached (being unmounted, its process gone) is
/// passed over with a warning, as long as another answers.
fn call_each(
    (targets, local): (Vec<NidList>, bool),
    opcode: u16,
    body: &[u8],
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let mut texts = Vec::new();
    let mut unreachable = Vec::new();
    for server in targets {
        match call_param_any(&server, opcode, body) {
            Ok(text) => texts.push(text),
            Err(ParamError::Unreachable(m)) if local => unreachable.push(m),
            Err(e) => return Err(e.into()),
        }
    }
    if texts.is_empty()
        && let Some(first) = unreachable.first()
    {
        return Err(first.clone().into());
    }
    for m in unreachable {
        eprintln!("nacre: passed over a mount that does not answer: {m}");
    }
    Ok(texts)
}

fn set_param(server: Option<NidList>, permanent: bool, setting: &str) -> Result<(), Box<dyn std::error::Error>> {
    let (name, value) = setting.split_once('=').ok_or_else(|| format!("{setting:?}: expected NAME=VALUE"))?;
    if name.len() > nacre_proto::param::PATTERN_MAX || value.len() > nacre_proto::param::VALUE_MAX {
        return Err("name or value too long".into());
    }
    let (op, body) = if permanent {
        nacre_proto::mgs::Request::SetParam { name: name.to_string(), value: value.to_string() }.encode()
    } else {
        (nacre_proto::param::OP_SET_PARAM, nacre_proto::param::encode_set(name, value))
    };
    call_each(param_targets(server, permanent)?, op, &body)?;
    Ok(())
}

fn get_param(server: Option<NidList>, pattern: &str) -> Result<(), Box<dyn std::error::Error>> {
    if pattern.len() > nacre_proto::param::PATTERN_MAX {
        return Err(format!("pattern of {} bytes (at most {})", pattern.len(), nacre_proto::param::PATTERN_MAX).into());
    }
    let body = nacre_proto::param::encode_get(pattern);
    let texts = call_each(param_targets(server, false)?, nacre_proto::param::OP_GET_PARAM, &body)?;
    for text in &texts {
        print!("{text}");
    }
    if texts.iter().all(String::is_empty) {
        return Err(format!("no parameter matches {pattern:?}").into());
    }
    Ok(())
}

fn main() {
    // `mount -t nacre SOURCE DIR` runs /sbin/mount.nacre, a link to this program.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&argv0).file_name().is_some_and(|n| n == "mount.nacre") {
        let code = match fsys::mount_helper(std::env::args().skip(1).collect()) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("mount.nacre: {e}");
                // mount(8)'s "mount failure".
                32
            }
        };
        std::process::exit(code);
    }
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Raid(cmd) => raid::run(cmd),
        Command::Net(cmd) => net::run(cmd),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Up(a) => up::up(a),
        Command::Down(a) => up::down(a),
        Command::Server(a) => up::server(a),
        Command::Status(a) => ha::status(a),
        Command::Failover(a) => ha::failover(a),
        Command::Failback(a) => ha::failback(a),
        Command::Mount(a) => fsys::mount(a),
        Command::Umount(a) => fsys::unmount(&a.path, false),
        Command::Setstripe(a) => fsys::setstripe(a),
        Command::Getstripe(a) => fsys::getstripe(a),
        Command::Setdirstripe(a) => fsys::setdirstripe(a),
        Command::Getdirstripe(a) => fsys::getdirstripe(a),
        Command::Mkdir(a) => fsys::mkdir(a),
        Command::Df(a) => fsys::df(a),
        Command::Find(a) => fsys::find(a),
        Command::Io500(a) => io500::io500(a),
        Command::Demo(a) => demo::demo(a),
        Command::Ost(cmd) => ost::run(cmd),
        Command::Mdt(cmd) => mdt::run(cmd),
        Command::Mgs(cmd) => mgs::run(cmd),
        Command::GetParam { server, pattern } => get_param(server, &pattern),
        Command::SetParam { server, permanent, setting } => set_param(server, permanent, &setting),
        Command::Completions { shell } => completions(shell),
        Command::Man { dir } => man(dir.as_deref()),
    };
    if let Err(e) = result {
        if stdout_closed() {
            end_by_sigpipe();
        }
        eprintln!("nacre: {e}");
        std::process::exit(1);
    }
}
