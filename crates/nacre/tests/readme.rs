//! The README's commands, run as written. Every ```sh block of README.md runs in order, as
//! root, with the `nacre` built for these tests first on the PATH (where `cargo install`
//! would put the release one). The quick start's `scripts/quickstart` runs with that
//! binary (`NACRE_BIN`) and a short stonewall; its `scripts/test` is this very suite, so it
//! is only checked to be there. The paths the blocks use must not exist before (the test
//! refuses to touch what it did not make) and are removed after, whatever happens.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the quick start makes on this machine, removed at the end.
const QUICK_START_PATHS: [&str; 1] = ["/tmp/nacre-quickstart"];

/// What the README's other blocks make, removed at the end.
const BY_HAND_PATHS: [&str; 6] =
    ["/srv/nacre", "/mnt/nacre", "/tmp/scratch", "/tmp/drives", "/tmp/ost0", "/sbin/mount.nacre"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The blocks of `text` fenced as ```KIND, each as its lines.
fn blocks(text: &str, kind: &str) -> Vec<Vec<String>> {
    let open = format!("```{kind}");
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in text.lines() {
        match (&mut current, line.trim_end()) {
            (None, l) if l == open => current = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(b), l) => b.push(l.to_string()),
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "README.md: a ```{kind} block is not closed");
    blocks
}

/// The command of a README line, without its comment.
fn command(line: &str) -> &str {
    line.split("  #").next().unwrap_or("").trim()
}

/// Removes what the blocks made, however the test ends.
struct Cleanup {
    nacre_dir: PathBuf,
    paths: &'static [&'static str],
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.paths.contains(&"/srv/nacre") {
            let nacre = self.nacre_dir.join("nacre");
            let _ = Command::new(&nacre).args(["down", "--data", "/srv/nacre"]).output();
            let _ = Command::new("umount").arg("/mnt/nacre").output();
        }
        for p in self.paths {
            let p = Path::new(p);
            if p.is_symlink() || p.is_file() {
                let _ = std::fs::remove_file(p);
            } else if p.exists() {
                let _ = std::fs::remove_dir_all(p);
            }
        }
    }
}

fn run(script: &str, cwd: &Path, path_env: &str, extra_env: &[(&str, String)]) {
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(cwd)
        .env("PATH", path_env)
        .envs(extra_env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "README block failed ({}):\n{script}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `nacre` built for these tests, its folder (first on the PATH), and that PATH.
fn nacre_path() -> (PathBuf, String) {
    let nacre_dir = Path::new(env!("CARGO_BIN_EXE_nacre")).parent().unwrap().to_path_buf();
    let path_env = format!("{}:{}", nacre_dir.display(), std::env::var("PATH").unwrap_or_default());
    (nacre_dir, path_env)
}

/// Refuses to run over `paths` that exist (the blocks would use them), then removes them
/// when dropped.
fn claim(paths: &'static [&'static str], nacre_dir: &Path) -> Cleanup {
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the README's commands run as root (mounts, /srv, /sbin)");
    for p in paths {
        assert!(
            !Path::new(p).exists() && !Path::new(p).is_symlink(),
            "{p} exists: the README's commands would use it; move it away to run this test"
        );
    }
    Cleanup { nacre_dir: nacre_dir.to_path_buf(), paths }
}

fn sh_blocks() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let sh = blocks(&readme, "sh");
    assert!(sh.len() >= 4, "README.md has {} ```sh blocks", sh.len());
    sh
}

// The quick start and the by-hand blocks are two tests, so they run side by side: each
// takes most of a minute, and neither touches what the other makes.

#[test]
fn the_quick_start_runs_as_written() {
    let (nacre_dir, path_env) = nacre_path();
    let _cleanup = claim(&QUICK_START_PATHS, &nacre_dir);
    let sh = sh_blocks();
    // Exactly the two commands.
    let quick: Vec<&str> = sh[0].iter().map(|l| command(l)).filter(|c| !c.is_empty()).collect();
    assert_eq!(quick, ["scripts/quickstart", "scripts/test"], "the quick start has exactly two commands");
    assert!(repo().join("scripts/test").is_file() && repo().join(".ci/run").is_file());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    run(
        "scripts/quickstart",
        &repo(),
        &path_env,
        &[
            ("NACRE_BIN", format!("{}", nacre_dir.join("nacre").display())),
            ("QUICKSTART_STONEWALL", "1".into()),
            ("QUICKSTART_PORT", port.to_string()),
        ],
    );
    assert!(!Path::new("/tmp/nacre-quickstart").exists(), "the quick start removed its folder");
}

#[test]
fn every_other_command_block_of_the_readme_runs_as_written() {
    let (nacre_dir, path_env) = nacre_path();
    let _cleanup = claim(&BY_HAND_PATHS, &nacre_dir);
    let cwd = std::env::temp_dir().join(format!("nacre-readme-{}", std::process::id()));
    std::fs::create_dir_all(&cwd).unwrap();
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let sh = sh_blocks();

    // The TOML examples are read by what reads them: a cluster file by `nacre server` (which
    // then names its nodes), an io500 config by `nacre io500` (which then looks for --dir).
    let tomls = blocks(&readme, "toml");
    assert_eq!(tomls.len(), 3, "README.md's TOML examples: two cluster files and an io500 config");
    for (i, t) in tomls.iter().enumerate() {
        let file = cwd.join(format!("example{i}.toml"));
        std::fs::write(&file, t.join("\n")).unwrap();
        let nacre = nacre_dir.join("nacre");
        let names: Vec<&str> = t.iter().filter_map(|l| l.strip_prefix("name = \"")?.split('"').next()).collect();
        let (args, says): (Vec<&str>, String) = if t.iter().any(|l| l.starts_with("[[node]]")) {
            (
                vec!["server", "--config", file.to_str().unwrap(), "--node", "none"],
                format!("no node \"none\" (nodes: {})", names.join(", ")),
            )
        } else {
            let dir = "/nonexistent/io500";
            (vec!["io500", "--config", file.to_str().unwrap(), "--dir", dir], dir.to_string())
        };
        let out = Command::new(&nacre).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(&says), "README TOML example {i}: {err}");
    }

    // Every other block, in order, verbatim.
    for block in &sh[1..] {
        run(&block.join("\n"), &cwd, &path_env, &[]);
    }
    assert!(cwd.join("io500.json").is_file(), "the by-hand io500 wrote its --json file");
    std::fs::remove_dir_all(&cwd).unwrap();
    // The by-hand section stopped what it started.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(" /mnt/nacre "), "a mount is left on /mnt/nacre");
}
