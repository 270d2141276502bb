//! Names the commit the `nacre` command is built from, for `nacre --version`: the short
//! hash of git's HEAD at build time, or `unknown` outside a git checkout (a source
//! tarball).

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=NACRE_COMMIT={commit}");
    // Run again when HEAD moves: a commit, a checkout.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={}", Path::new(&dir).join("HEAD").display());
        // The branch's ref: a loose file, or a line of packed-refs (a path that does not
        // exist would run this script at every build).
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            let loose = Path::new(&dir).join(head);
            let at = if loose.exists() { loose } else { Path::new(&dir).join("packed-refs") };
            if at.exists() {
                println!("cargo:rerun-if-changed={}", at.display());
            }
        }
    }
}
