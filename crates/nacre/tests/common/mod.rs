//! What the `nacre` command's tests share: running the binary, reopening drive files,
//! seeds that can be replayed, killing a child on the way out, and reading a bench's JSON
//! line. Each test binary uses part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;

use nacre_raid::{BlockDevice, FileDrive};

pub fn nacre() -> Command {
    Command::new(env!("CARGO_BIN_EXE_nacre"))
}

/// Start a serving process (`args` then `--dir DIR`); returns it and the NID it printed.
pub fn serve(args: &[&str], dir: &Path) -> (Kill, String) {
    use std::io::BufRead;
    let mut child = nacre()
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line).unwrap();
    assert!(line.starts_with("serving"), "{args:?} printed {line:?}");
    (Kill(child), line.trim().rsplit(' ').next().unwrap().to_string())
}

/// Every file in `dir`, in name order, opened as a drive.
pub fn drives_in(dir: &Path) -> Vec<Arc<dyn BlockDevice>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    paths.into_iter().map(|p| Arc::new(FileDrive::open(&p).unwrap()) as Arc<dyn BlockDevice>).collect()
}

/// `NACRE_SEED` if set, else the clock; printed so a failing run can be replayed.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("NACRE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("{test}: seed {seed} (rerun with NACRE_SEED={seed})");
    seed
}

/// A child process killed (and reaped) when the test is done with it, pass or fail.
pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The last line of a successful bench run, as JSON, after checking that each of `keys`
/// is there and positive.
pub fn bench_figures(out: &std::process::Output, keys: &[&str]) -> serde_json::Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    for key in keys {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {last}"));
        assert!(x > 0.0, "{key} = {x}");
    }
    v
}

/// A free TCP port for an MGS, below the kernel's ephemeral range (32768 and up): a port
/// the kernel handed out could be handed out again, to a service's listener or a
/// connection, between this check and the MGS's bind ("Address already in use"). The
/// 15 ports after it are free too, and no other call of this process returns one of
/// them: `nacre up --ha` gives its nodes fixed ports there.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(37) % 750;
    loop {
        let port = (20_000 + 16 * ((start + NEXT.fetch_add(1, Ordering::Relaxed)) % 750)) as u16;
        if (port..port + 16).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return port;
        }
    }
}

/// A new empty folder `TMP/nacre-KIND-NAME-PID` (an earlier one of that name removed).
pub fn scratch(kind: &str, name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("nacre-{kind}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// A file system from `nacre up` (two OSTs of 64M, an MDT of 64M), mounted; `nacre down`
/// when dropped, and its folder removed.
pub struct Up {
    pub data: std::path::PathBuf,
    pub mnt: std::path::PathBuf,
    pub port: u16,
}

impl Up {
    /// In the scratch folder `root`, with more `nacre up` options (the first up makes the
    /// file system with them).
    pub fn start_in(root: std::path::PathBuf, extra: &[&str]) -> Up {
        let (data, mnt) = (root.join("data"), root.join("mnt"));
        std::fs::create_dir_all(&mnt).unwrap();
        let up = Up { data, mnt, port: free_port() };
        up.up_with(extra);
        up
    }

    pub fn up(&self) {
        self.up_with(&[])
    }

    pub fn up_with(&self, extra: &[&str]) {
        let out = nacre()
            .arg("up")
            .args(extra)
            .args(["--osts", "2", "--ost-size", "64M", "--mdt-size", "64M", "--port"])
            .arg(self.port.to_string())
            .arg("--data")
            .arg(&self.data)
            .arg("--mount")
            .arg(&self.mnt)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nacre up: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("ready"), "{}", String::from_utf8_lossy(&out.stdout));
    }

    pub fn down(&self) {
        let out = nacre().arg("down").arg("--data").arg(&self.data).output().unwrap();
        assert!(out.status.success(), "nacre down: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn mgs(&self) -> String {
        format!("127.0.0.1@tcp:{}", self.port)
    }
}

impl Drop for Up {
    /// Whatever the test did: the file system stopped, every mount under its folder taken
    /// off (a second mount a failed assertion left, whose process then ends), the folder
    /// removed.
    fn drop(&mut self) {
        use std::process::Command;
        let _ = nacre().arg("down").arg("--data").arg(&self.data).output();
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).output();
        if let Some(root) = self.data.parent() {
            let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            for point in mounts.lines().filter_map(|l| l.split(' ').nth(4)) {
                if Path::new(point).starts_with(&root) {
                    let _ = Command::new("umount").arg("-l").arg(point).output();
                }
            }
            let _ = std::fs::remove_dir_all(root);
        }
    }
}
