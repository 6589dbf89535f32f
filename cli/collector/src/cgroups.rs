//! `watch --cgroup PATH` and `--container NAME|ID`: the cgroup v2 subtrees
//! selected, the ids the kernel watches execs in, and the processes in them
//! now (a process moved into a cgroup without exec is found here, at the
//! next look).

use std::{
    collections::BTreeSet,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

use super::containers::Containers;
use stackprobe_model::containers::Container;
use stackprobe_probes::procfs;

/// The cgroup v2 hierarchy's mount point.
pub fn mount() -> Result<PathBuf> {
    procfs::cgroup2_mount().context(
        "no cgroup v2 hierarchy is mounted: --cgroup and --container need one (the kernel \
         tells processes' cgroups apart by their v2 cgroup)",
    )
}

/// A `--cgroup` argument as a path from the hierarchy's root: given from the
/// root (`/system.slice/x.service`, as /proc/PID/cgroup shows it) or as a
/// directory under the mount.
pub fn resolve(mount: &Path, arg: &str) -> Result<String> {
    let rel = match Path::new(arg).strip_prefix(mount) {
        Ok(rel) => format!("/{}", rel.display()),
        Err(_) => arg.to_string(),
    };
    let dir = mount.join(rel.trim_start_matches('/'));
    if !rel.starts_with('/') || !dir.is_dir() {
        bail!(
            "no cgroup {arg}: give a path from the cgroup v2 root, as /proc/PID/cgroup shows it, \
             or a directory under {}",
            mount.display()
        );
    }
    let rel = rel.trim_end_matches('/');
    Ok(if rel.is_empty() {
        "/".into()
    } else {
        rel.into()
    })
}

/// The cgroups of the running container `wanted` (a name, or an id or its
/// prefix): each process's cgroup cut after the container's own scope.
pub fn of_container(containers: &mut Containers, wanted: &str) -> Result<Vec<String>> {
    let mut found = BTreeSet::new();
    for p in procfs::processes() {
        let Some(path) = procfs::cgroup(p.pid) else {
            continue;
        };
        let Some(c) = containers.of_path(&path) else {
            continue;
        };
        if c.matches(wanted) {
            found.insert(container_root(&path, &c));
        }
    }
    if found.is_empty() {
        bail!("no running container {wanted} (by name, or id or id prefix of 4 or more digits)");
    }
    Ok(found.into_iter().collect())
}

/// `path` up to the part naming container `c`.
fn container_root(path: &str, c: &Container) -> String {
    let mut root = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        root.push('/');
        root.push_str(part);
        if part.contains(&c.id) {
            break;
        }
    }
    root
}

/// Every cgroup directory in the selected subtrees.
fn dirs(mount: &Path, selected: &[String]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo: Vec<PathBuf> = selected
        .iter()
        .map(|c| mount.join(c.trim_start_matches('/')))
        .collect();
    while let Some(dir) = todo.pop() {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            todo.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
            out.push(dir);
        }
    }
    out
}

/// The v2 ids (directory inode numbers) of every cgroup in the subtrees.
pub fn ids(mount: &Path, selected: &[String]) -> Vec<u64> {
    dirs(mount, selected)
        .iter()
        .filter_map(|d| std::fs::metadata(d).ok().map(|m| m.ino()))
        .collect()
}

/// Every process in the subtrees now.
pub fn processes(mount: &Path, selected: &[String]) -> Vec<u32> {
    dirs(mount, selected)
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|procs| {
            procs
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_is_given_from_the_root_or_under_the_mount() {
        let mount = std::env::temp_dir().join(format!("sp-cgroups-{}", std::process::id()));
        std::fs::create_dir_all(mount.join("system.slice/a.scope/inner")).unwrap();
        std::fs::write(mount.join("system.slice/a.scope/cgroup.procs"), "12\n13\n").unwrap();
        std::fs::write(
            mount.join("system.slice/a.scope/inner/cgroup.procs"),
            "14\n",
        )
        .unwrap();
        let under = mount.join("system.slice/a.scope");
        assert_eq!(
            resolve(&mount, under.to_str().unwrap()).unwrap(),
            "/system.slice/a.scope"
        );
        assert_eq!(
            resolve(&mount, "/system.slice/a.scope/").unwrap(),
            "/system.slice/a.scope"
        );
        assert_eq!(resolve(&mount, "/").unwrap(), "/");
        assert!(resolve(&mount, "/system.slice/nope").is_err());
        assert!(resolve(&mount, "system.slice").is_err());
        let selected = ["/system.slice/a.scope".to_string()];
        assert_eq!(ids(&mount, &selected).len(), 2);
        let mut procs = processes(&mount, &selected);
        procs.sort();
        assert_eq!(procs, [12, 13, 14]);
        std::fs::remove_dir_all(&mount).unwrap();
    }

    #[test]
    fn a_containers_root_is_its_scope() {
        let id = "4f2a9c1be07d5e3c8a6b2f1d0e9c7b5a3f1e2d4c6b8a0f9e7d5c3b1a29384756";
        let path = format!("/machine.slice/libpod-{id}.scope/container");
        let c = Container::from_cgroup(&path).unwrap();
        assert_eq!(
            container_root(&path, &c),
            format!("/machine.slice/libpod-{id}.scope")
        );
    }
}
