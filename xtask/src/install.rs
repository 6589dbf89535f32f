//! `cargo xtask install`: the binary into /usr/local/bin, and the agent's
//! systemd unit (dist/systemd) beside it, enabled only when asked.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::process::{capture, cargo, run_cmd, workspace_root};

pub const UNIT: &str = "stackprobe-agent.service";
const UNIT_DIR: &str = "etc/systemd/system";
/// The agent's arguments (EnvironmentFile of the unit). The Debian package
/// (`cargo xtask dist`) owns the same path as a conffile, and both units
/// read it: one place for the arguments, whichever way stackprobe came.
/// So this never overwrites it (see `place_unit`). Installing the package
/// over it, dpkg takes an unedited copy as its own and asks about an
/// edited one (keeping it by default). The binary and the unit, by contrast,
/// go where the package never puts anything (/usr/local/bin,
/// /etc/systemd/system, which systemd reads before the package's
/// /usr/lib/systemd/system): a local build overrides the package, and
/// neither removes the other's files.
const DEFAULTS: &str = "etc/default/stackprobe-agent";

#[derive(clap::Args)]
pub struct InstallArgs {
    /// Also enable and start the agent's systemd unit (with --root: enable
    /// it there, for the next boot).
    #[arg(long)]
    pub enable_agent: bool,
    /// Install under this directory instead of / (an image being built).
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
}

pub fn run(args: &InstallArgs) -> Result<()> {
    let prefix = args.root.join("usr/local");
    run_cmd(
        cargo()
            .args([
                "install",
                "--locked",
                "--path",
                "cli",
                "--bin",
                "stackprobe",
            ])
            .args(["--root".as_ref(), prefix.as_os_str(), "--force".as_ref()]),
    )?;
    place_unit(&args.root)?;
    let live = args.root == Path::new("/");
    if live && packaged() {
        eprintln!(
            "xtask: the stackprobe package is installed too: /usr/local/bin/stackprobe and \
             /{UNIT_DIR}/{UNIT} now take precedence over its /usr/bin/stackprobe and unit"
        );
    }
    // Whether systemd runs this machine (sd_booted's test).
    let systemd = live && Path::new("/run/systemd/system").exists();
    if systemd {
        run_cmd(Command::new("systemctl").arg("daemon-reload"))?;
    }
    if args.enable_agent {
        if live && !systemd {
            bail!(
                "systemd is not running here (no /run/systemd/system): the unit is in /{UNIT_DIR}/{UNIT}, \
                 but nothing can start it; run `stackprobe agent` under your service manager instead"
            );
        }
        let mut systemctl = Command::new("systemctl");
        if live {
            systemctl.args(["enable", "--now", UNIT]);
        } else {
            systemctl
                .arg("--root")
                .arg(&args.root)
                .args(["enable", UNIT]);
        }
        run_cmd(&mut systemctl)?;
    }
    eprintln!(
        "xtask: installed {}/bin/stackprobe and {}; the agent's arguments are in {}{}",
        prefix.display(),
        args.root.join(UNIT_DIR).join(UNIT).display(),
        args.root.join(DEFAULTS).display(),
        if args.enable_agent {
            ""
        } else {
            "; start it with `systemctl enable --now stackprobe-agent` (or install with --enable-agent)"
        }
    );
    Ok(())
}

/// Whether the Debian package `cargo xtask dist` builds is installed here.
fn packaged() -> bool {
    capture(Command::new("dpkg-query").args(["-W", "-f=${Status}", "stackprobe"]))
        .is_ok_and(|s| s.contains("install ok installed"))
}

/// Puts the unit and its defaults under `root`: the unit replaced (it is
/// ours), the defaults only written when absent (they are the user's).
pub fn place_unit(root: &Path) -> Result<()> {
    let dist = workspace_root().join("dist/systemd");
    let unit_dir = root.join(UNIT_DIR);
    fs::create_dir_all(&unit_dir).with_context(|| format!("creating {}", unit_dir.display()))?;
    fs::copy(dist.join(UNIT), unit_dir.join(UNIT))
        .with_context(|| format!("installing {UNIT} into {}", unit_dir.display()))?;
    let defaults = root.join(DEFAULTS);
    if !defaults.exists() {
        let dir = defaults.parent().expect("a file in etc/default");
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        fs::copy(dist.join("stackprobe-agent.default"), &defaults)
            .with_context(|| format!("writing {}", defaults.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_root(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-install-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_unit_is_replaced_and_the_users_arguments_kept() {
        let root = temp_root("place");
        place_unit(&root).unwrap();
        let unit = root.join(UNIT_DIR).join(UNIT);
        let shipped = fs::read_to_string(workspace_root().join("dist/systemd").join(UNIT)).unwrap();
        assert_eq!(fs::read_to_string(&unit).unwrap(), shipped);
        let defaults = root.join(DEFAULTS);
        assert!(
            fs::read_to_string(&defaults)
                .unwrap()
                .contains("STACKPROBE_AGENT_ARGS=")
        );
        fs::write(&unit, "stale").unwrap();
        fs::write(&defaults, "STACKPROBE_AGENT_ARGS=\"postgres\"\n").unwrap();
        place_unit(&root).unwrap();
        assert_eq!(fs::read_to_string(&unit).unwrap(), shipped);
        assert_eq!(
            fs::read_to_string(&defaults).unwrap(),
            "STACKPROBE_AGENT_ARGS=\"postgres\"\n"
        );
        fs::remove_dir_all(&root).unwrap();
    }

    /// Enabling in an image (`--root`) is what `systemctl --root` does
    /// offline: the unit linked from multi-user.target's wants.
    #[test]
    fn enabling_under_a_root_links_the_unit_into_multi_user() {
        let root = temp_root("enable");
        place_unit(&root).unwrap();
        run_cmd(
            Command::new("systemctl")
                .arg("--root")
                .arg(&root)
                .args(["enable", UNIT]),
        )
        .unwrap();
        let wanted = root
            .join(UNIT_DIR)
            .join("multi-user.target.wants")
            .join(UNIT);
        assert_eq!(
            fs::read_link(&wanted).unwrap(),
            Path::new("/").join(UNIT_DIR).join(UNIT)
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
