//! Stamps the binary with the commit it was built from, for `--version`:
//! `0.1.0 (commit 1a2b3c4)`, with `-dirty` when tracked files differed from
//! it, or why there is no commit to name. A bug report then says which code
//! ran, which the crate version alone cannot (it stays 0.1.0 across
//! hundreds of commits).
//!
//! Plain `git`, not a crate such as vergen: one command's output is all we
//! need, and a missing git must not break the build.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let version = env::var("CARGO_PKG_VERSION").expect("set by cargo");
    let commit = match Checkout::find(&manifest_dir) {
        Ok(checkout) => {
            checkout.watch();
            checkout.describe()
        }
        Err(why) => {
            // Without any rerun-if line cargo reruns this script when any
            // file of the package changes; this keeps it to real edits of it.
            println!("cargo:rerun-if-changed=build.rs");
            format!("unknown: {why}")
        }
    };
    println!("cargo:rustc-env=STACKPROBE_VERSION={version} (commit {commit})");
}

struct Checkout {
    dir: PathBuf,
    /// Where HEAD and the index live (per worktree).
    git_dir: PathBuf,
    /// Where refs and packed-refs live (shared by worktrees).
    common_dir: PathBuf,
}

impl Checkout {
    fn find(dir: &Path) -> Result<Self, String> {
        let out = match Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["rev-parse", "--git-dir", "--git-common-dir"])
            .output()
        {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(if dir.ancestors().any(|d| d.join(".git").exists()) {
                    "git is not installed".into()
                } else {
                    "built outside a git checkout".into()
                });
            }
            Err(e) => return Err(format!("git did not run ({e})")),
        };
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            if stderr.contains("not a git repository") {
                return Err("built outside a git checkout".into());
            }
            // e.g. "detected dubious ownership": the build goes on, and says why.
            println!(
                "cargo:warning=git could not read the checkout: {}",
                stderr.trim()
            );
            return Err("git could not read the checkout".into());
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut lines = stdout.lines().map(|l| dir.join(l));
        let (Some(git_dir), Some(common_dir)) = (lines.next(), lines.next()) else {
            return Err("git rev-parse printed no git directory".into());
        };
        let checkout = Self {
            dir: dir.to_path_buf(),
            git_dir,
            common_dir,
        };
        // A copy of the sources unpacked inside some other checkout (cargo
        // package's target/package/…, a tarball under a home directory kept
        // in git) must not be stamped with that checkout's commit.
        if checkout
            .git(&["ls-files", "--error-unmatch", "Cargo.toml"])
            .is_none()
        {
            return Err("built outside a git checkout".into());
        }
        Ok(checkout)
    }

    /// Reruns this script when HEAD moves (checkout, commit, reset) or the
    /// index changes (staging, and git refreshing what it knows of the
    /// tree), and not on every build. An unstaged edit alone is not seen
    /// until the index changes: the price of not rescanning the tree.
    fn watch(&self) {
        let head = self.git_dir.join("HEAD");
        rerun_if_changed(&head);
        rerun_if_changed(&self.git_dir.join("index"));
        rerun_if_changed(&self.common_dir.join("packed-refs"));
        rerun_if_changed(&self.common_dir.join("reftable"));
        if let Some(reference) = std::fs::read_to_string(&head)
            .ok()
            .as_deref()
            .and_then(|h| h.strip_prefix("ref: "))
        {
            let loose = self.common_dir.join(reference.trim());
            if loose.exists() {
                rerun_if_changed(&loose);
            } else if let Some(parent) = loose.parent() {
                // Packed (or no commit yet): the first commit or a repack
                // writes the file, and its directory's mtime shows it.
                rerun_if_changed(parent);
            }
        }
    }

    fn describe(&self) -> String {
        let Some(hash) = self.git(&["rev-parse", "--short", "HEAD"]) else {
            return "unknown: the checkout has no commit yet".into();
        };
        // --no-optional-locks: a plain `git status` rewrites the index to
        // refresh it, which the watch above would take as a change, and
        // every build would run this script again.
        let dirty = self
            .git(&[
                "--no-optional-locks",
                "status",
                "--porcelain",
                "--untracked-files=no",
            ])
            .is_some_and(|s| !s.trim().is_empty());
        format!("{}{}", hash.trim(), if dirty { "-dirty" } else { "" })
    }

    fn git(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(&self.dir)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Only paths that exist: cargo treats a missing one as changed, which
/// would rerun this script on every build.
fn rerun_if_changed(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
