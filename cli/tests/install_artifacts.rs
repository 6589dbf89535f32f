//! What the Debian package ships beside the binary, as the binary makes it:
//! `--version` with the commit, `completions bash|zsh|fish`, and the man
//! pages of `manpages DIR`. None of it needs root, so when the tests run
//! as root the binary runs as nobody, with no capabilities. The package
//! itself is checked by `cargo xtask dist`, which builds it.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

const STACKPROBE: &str = env!("CARGO_BIN_EXE_stackprobe");
/// Subcommands for stackprobe's own use: neither completed nor paged.
const HIDDEN: &[&str] = &["demo-server", "manpages"];

/// `stackprobe ARGS`, as nobody when the tests run as root.
fn stackprobe(args: &[&str]) -> Output {
    // SAFETY: geteuid has no preconditions.
    let mut cmd = if unsafe { libc::geteuid() } == 0 {
        let mut setpriv = Command::new("setpriv");
        setpriv
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
            ])
            .arg(STACKPROBE);
        setpriv
    } else {
        Command::new(STACKPROBE)
    };
    let out = cmd.args(args).output().expect("running stackprobe");
    assert!(
        out.status.success(),
        "stackprobe {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("UTF-8 on stdout")
}

/// A directory nobody can write into, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("stackprobe-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The subcommands `--help` lists, without `help`: what a user can type,
/// hence what completes and has a man page.
fn visible_subcommands() -> Vec<String> {
    let help = stdout(&stackprobe(&["--help"]));
    let commands = help
        .split("Commands:\n")
        .nth(1)
        .expect("--help has a Commands section");
    let names: Vec<String> = commands
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(String::from)
        .collect();
    for name in ["watch", "agent", "doctor", "completions"] {
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }
    assert!(
        !names.iter().any(|n| HIDDEN.contains(&n.as_str())),
        "a hidden subcommand is listed: {names:?}"
    );
    names
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let version = stdout(&stackprobe(&["--version"]));
    assert_eq!(stdout(&stackprobe(&["-V"])), version);
    let commit = version
        .strip_prefix(&format!(
            "stackprobe {} (commit ",
            env!("CARGO_PKG_VERSION")
        ))
        .and_then(|rest| rest.strip_suffix(")\n"))
        .unwrap_or_else(|| panic!("not `stackprobe VERSION (commit …)`: {version:?}"));
    if git(&["ls-files", "--error-unmatch", "Cargo.toml"]).is_none() {
        assert_eq!(commit, "unknown: built outside a git checkout");
        return;
    }
    let hash = commit.strip_suffix("-dirty").unwrap_or(commit);
    assert!(
        hash.len() >= 7 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "not a short hash: {commit:?}"
    );
    // A commit of this checkout (HEAD may have moved on since the build).
    assert!(
        git(&["cat-file", "-e", &format!("{hash}^{{commit}}")]).is_some(),
        "{hash} is no commit of this checkout"
    );
}

#[test]
fn bash_completes_subcommands_and_options() {
    let scratch = Scratch::new("bash-completion");
    let script = scratch.0.join("stackprobe");
    fs::write(&script, stdout(&stackprobe(&["completions", "bash"]))).unwrap();
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        syntax.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    // What bash-completion does on Tab: call the function the script
    // registered with the words typed so far.
    let complete = |line: &str| -> BTreeSet<String> {
        let words: Vec<&str> = line.split(' ').collect();
        let program = format!(
            "source {script}; complete -p stackprobe >/dev/null || exit 3; \
             COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE='{line}'; COMP_POINT={point}; \
             _stackprobe stackprobe '{current}' '{previous}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script = script.display(),
            words = words
                .iter()
                .map(|w| format!("'{w}'"))
                .collect::<Vec<_>>()
                .join(" "),
            cword = words.len() - 1,
            point = line.len(),
            current = words[words.len() - 1],
            previous = words[words.len().saturating_sub(2)],
        );
        let out = Command::new("bash")
            .args(["--norc", "-c", &program])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "completing {line:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().to_string())
            .collect()
    };
    let subcommands = complete("stackprobe ");
    for name in visible_subcommands() {
        assert!(subcommands.contains(&name), "{name} not in {subcommands:?}");
    }
    for hidden in HIDDEN {
        assert!(!subcommands.contains(*hidden), "{hidden} offered");
    }
    assert_eq!(
        complete("stackprobe wa"),
        BTreeSet::from(["watch".to_string()])
    );
    assert!(complete("stackprobe watch --run").contains("--run-queue"));
    assert_eq!(
        complete("stackprobe completions f"),
        BTreeSet::from(["fish".to_string()])
    );
}

/// `SHELL -n` when the shell is installed (`cargo xtask setup` installs
/// both); otherwise at least the script is the shell's and names every
/// subcommand.
#[test]
fn zsh_and_fish_scripts_parse() {
    let subcommands = visible_subcommands();
    for (shell, file, marker) in [
        ("zsh", "_stackprobe", "#compdef stackprobe"),
        ("fish", "stackprobe.fish", "complete -c stackprobe"),
    ] {
        let scratch = Scratch::new(&format!("{shell}-completion"));
        let text = stdout(&stackprobe(&["completions", shell]));
        assert!(text.contains(marker), "{shell}: no `{marker}`");
        for name in &subcommands {
            assert!(text.contains(name.as_str()), "{shell}: {name} missing");
        }
        for hidden in HIDDEN {
            assert!(!text.contains(hidden), "{shell}: offers {hidden}");
        }
        let path = scratch.0.join(file);
        fs::write(&path, &text).unwrap();
        match Command::new(shell).arg("-n").arg(&path).output() {
            Ok(out) => assert!(
                out.status.success(),
                "{shell} -n: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("{shell} is not installed: only the script's names were checked");
            }
            Err(e) => panic!("running {shell}: {e}"),
        }
    }
    let fish = Command::new("fish")
        .args(["--no-config", "-c"])
        .arg(format!(
            "{} completions fish | source; complete -C'stackprobe watch --run'",
            STACKPROBE
        ))
        .output();
    if let Ok(out) = fish {
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("--run-queue"),
            "fish does not complete --run-queue: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn manpages_writes_one_page_per_subcommand_and_man_renders_them() {
    let scratch = Scratch::new("man");
    // A directory it has to create, as `cargo xtask dist` asks it to.
    let dir = scratch.0.join("man1");
    let out = stackprobe(&["manpages", dir.to_str().unwrap()]);
    let mut expected: BTreeSet<String> = visible_subcommands()
        .iter()
        .map(|s| format!("stackprobe-{s}.1"))
        .collect();
    expected.insert("stackprobe.1".into());
    let written: BTreeSet<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(written, expected);
    let printed: BTreeSet<String> = stdout(&out)
        .lines()
        .map(|l| {
            Path::new(l)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(printed, expected, "it prints the pages it wrote");

    let watch = render(&dir.join("stackprobe-watch.1"));
    for text in ["stackprobe-watch", "SYNOPSIS", "--run-queue", "--duration"] {
        assert!(watch.contains(text), "no {text:?} in:\n{watch}");
    }
    let footer = format!("stackprobe {} (commit", env!("CARGO_PKG_VERSION"));
    assert!(watch.contains(&footer), "{watch}");
    let main = render(&dir.join("stackprobe.1"));
    assert!(main.contains(&footer), "{main}");
    assert!(main.contains("stackprobe-watch(1)"), "{main}");
}

/// The page as `man -l` shows it, in ASCII; groff's warnings fail the test.
fn render(page: &Path) -> String {
    let out = Command::new("man")
        .args(["--warnings", "-l"])
        .arg(page)
        .env("LC_ALL", "C")
        .env("MANWIDTH", "120")
        .env("MANPAGER", "cat")
        .output()
        .expect("running man (apt-get install man-db, or `cargo xtask setup`)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "man -l {}: {}\n{}",
        page.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
