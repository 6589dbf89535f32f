//! Files stackprobe writes, usually as root: never through a symlink, never
//! over an existing file unless `--force`, and owned by the user who ran
//! sudo rather than by root.

use std::{
    fs::{File, OpenOptions},
    os::{fd::AsRawFd as _, unix::fs::OpenOptionsExt as _},
    path::Path,
};

use anyhow::{Context as _, Result, bail};

pub fn create(path: &Path, force: bool, what: &str) -> Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).custom_flags(libc::O_NOFOLLOW);
    if force {
        options.create(true).truncate(true);
    } else {
        // O_EXCL: fails on any existing name, a symlink included.
        options.create_new(true);
    }
    let file = match options.open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            bail!(
                "{what} {} exists; pass --force to overwrite it",
                path.display()
            )
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            bail!(
                "{what} {} is a symbolic link; stackprobe does not write through links",
                path.display()
            )
        }
        Err(e) => return Err(e).with_context(|| format!("creating the {what} {}", path.display())),
    };
    give_to(&file, sudo_user())
        .with_context(|| format!("giving {} to the sudo user", path.display()))?;
    Ok(file)
}

/// Under sudo, root's files go to the user who asked for them.
fn sudo_user() -> Option<(u32, u32)> {
    let id = |name: &str| std::env::var(name).ok()?.parse::<u32>().ok();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    Some((id("SUDO_UID")?, id("SUDO_GID")?))
}

fn give_to(file: &File, owner: Option<(u32, u32)>) -> Result<()> {
    let Some((uid, gid)) = owner else {
        return Ok(());
    };
    // SAFETY: fchown on an fd we own.
    if unsafe { libc::fchown(file.as_raw_fd(), uid, gid) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt as _, symlink};

    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sp-file-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn an_existing_file_is_kept_unless_forced() {
        let dir = scratch("exists");
        let path = dir.join("run.hlog");
        std::fs::write(&path, "precious").unwrap();
        let err = create(&path, false, "recording").unwrap_err();
        assert!(
            format!("{err:#}").contains("exists; pass --force"),
            "{err:#}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
        create(&path, true, "recording").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_symlink_is_never_written_through() {
        let dir = scratch("link");
        let target = dir.join("target");
        std::fs::write(&target, "precious").unwrap();
        let link = dir.join("run.hlog");
        symlink(&target, &link).unwrap();
        for force in [false, true] {
            let err = create(&link, force, "recording").unwrap_err();
            assert!(
                format!("{err:#}").contains(if force { "symbolic link" } else { "exists" }),
                "{err:#}"
            );
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn under_sudo_the_file_belongs_to_the_sudo_user() {
        // The suite runs as root (CI does); fchown needs it.
        assert_eq!(unsafe { libc::geteuid() }, 0, "run the tests as root");
        let dir = scratch("sudo");
        let path = dir.join("run.hlog");
        let file = create(&path, false, "recording").unwrap();
        give_to(&file, Some((65534, 65534))).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
