//! `stackprobe completions SHELL` and the hidden `stackprobe manpages DIR`.
//! Both are generated from the clap definitions at run time, so they cannot
//! drift from `--help`; the Debian package ships what the release binary
//! printed (`cargo xtask dist`). Neither needs root nor loads anything.

use std::{
    fs,
    io::{self, Write as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use clap::CommandFactory as _;

use crate::cli::{Cli, Shell};

/// Prints the completion script for `shell` to stdout.
pub fn print(shell: Shell) -> Result<()> {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut cmd = visible(&Cli::command());
    // clap_complete panics when its writer fails; a buffer cannot, and the
    // write to stdout below gets a message instead.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "stackprobe", &mut script);
    write_stdout(&script)
}

/// The command as a user may type it. clap_complete offers hidden
/// subcommands too (demo-server, manpages), and clap cannot remove a
/// subcommand, so the root is built again with only the visible ones.
fn visible(cli: &clap::Command) -> clap::Command {
    let mut root = clap::Command::new("stackprobe")
        .version(env!("STACKPROBE_VERSION"))
        .subcommands(cli.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    if let Some(about) = cli.get_about() {
        root = root.about(about.clone());
    }
    root
}

/// Writes stackprobe.1 and one page per visible subcommand
/// (stackprobe-watch.1, …) into `dir`, creating it, and prints their paths.
pub fn manpages(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // `help` is not a page of its own: `man stackprobe` is that.
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    write_pages(&cmd, dir, &mut written)?;
    let list: String = written
        .iter()
        .map(|p| format!("{}\n", p.display()))
        .collect();
    write_stdout(list.as_bytes())
}

fn write_pages(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> Result<()> {
    // A subcommand's own footer would say "watch", with no version.
    let man = clap_mangen::Man::new(cmd.clone())
        .source(concat!("stackprobe ", env!("STACKPROBE_VERSION")));
    let path = dir.join(man.get_filename());
    let mut page = Vec::new();
    man.render(&mut page)
        .with_context(|| format!("rendering {}", path.display()))?;
    fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir, written)?;
    }
    Ok(())
}

fn write_stdout(bytes: &[u8]) -> Result<()> {
    let mut stdout = io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        // `stackprobe completions bash | head` is not an error.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every visible subcommand gets a page named as `man` looks it up,
    /// and hidden ones (demo-server, manpages) and `help` none.
    #[test]
    fn one_page_per_visible_subcommand() {
        let dir = std::env::temp_dir().join(format!("stackprobe-man-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut cmd = Cli::command().disable_help_subcommand(true);
        cmd.build();
        let mut written = Vec::new();
        write_pages(&cmd, &dir.join("missing"), &mut written)
            .expect_err("a missing directory is an error, not a panic");
        fs::create_dir_all(&dir).unwrap();
        write_pages(&cmd, &dir, &mut written).unwrap();
        let mut names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "stackprobe-agent.1",
                "stackprobe-completions.1",
                "stackprobe-demo.1",
                "stackprobe-diff.1",
                "stackprobe-doctor.1",
                "stackprobe-report.1",
                "stackprobe-watch.1",
                "stackprobe.1",
            ]
        );
        let watch = fs::read_to_string(dir.join("stackprobe-watch.1")).unwrap();
        let title = format!(
            ".TH stackprobe-watch 1  \"stackprobe {}\"",
            env!("STACKPROBE_VERSION")
        );
        assert!(watch.contains(&title), "{watch}");
        assert!(watch.contains("\\-\\-run\\-queue"), "{watch}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
