//! Which container a watched process runs in (from its cgroup) and the
//! container's name, where the runtime's state on this host says it:
//! Docker's `containers/<id>/config.v2.json`, Podman's
//! `overlay-containers/containers.json`. Names are read once per container;
//! containerd and CRI-O keep theirs in databases of their own, so their
//! containers show by short id.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use stackprobe_model::containers::{Container, Runtime};
use stackprobe_probes::procfs;

/// Where the runtimes keep their state.
#[derive(Clone, Debug)]
pub struct StateRoots {
    pub docker: PathBuf,
    pub podman: PathBuf,
}

impl Default for StateRoots {
    fn default() -> Self {
        Self {
            docker: PathBuf::from("/var/lib/docker"),
            podman: PathBuf::from("/var/lib/containers/storage"),
        }
    }
}

#[derive(Default)]
pub struct Containers {
    roots: StateRoots,
    /// Container → its name, once looked up.
    names: HashMap<(Runtime, String), Option<String>>,
}

impl Containers {
    #[cfg(test)]
    fn with_roots(roots: StateRoots) -> Self {
        Self {
            roots,
            names: HashMap::new(),
        }
    }

    /// The container process `pid` runs in, named when the runtime says.
    pub fn of(&mut self, pid: u32) -> Option<Container> {
        self.of_path(&procfs::cgroup(pid)?)
    }

    /// The container of a process in cgroup `path`, named when the runtime
    /// says.
    pub fn of_path(&mut self, path: &str) -> Option<Container> {
        self.named(Container::from_cgroup(path)?)
    }

    fn named(&mut self, mut c: Container) -> Option<Container> {
        let roots = &self.roots;
        c.name = self
            .names
            .entry((c.runtime, c.id.clone()))
            .or_insert_with(|| match c.runtime {
                Runtime::Docker => docker_name(&roots.docker, &c.id),
                Runtime::Podman => podman_name(&roots.podman, &c.id),
                _ => None,
            })
            .clone();
        Some(c)
    }
}

/// `"Name": "/db"` in Docker's config of container `id`.
fn docker_name(root: &Path, id: &str) -> Option<String> {
    let text =
        std::fs::read_to_string(root.join("containers").join(id).join("config.v2.json")).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    let name = config.get("Name")?.as_str()?.trim_start_matches('/');
    (!name.is_empty()).then(|| name.to_string())
}

/// The first of `"names"` of container `id` in Podman's list.
fn podman_name(root: &Path, id: &str) -> Option<String> {
    let text =
        std::fs::read_to_string(root.join("overlay-containers").join("containers.json")).ok()?;
    let list: serde_json::Value = serde_json::from_str(&text).ok()?;
    list.as_array()?
        .iter()
        .find(|c| c.get("id").and_then(|v| v.as_str()) == Some(id))?
        .get("names")?
        .get(0)?
        .as_str()
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f2a9c1be07d5e3c8a6b2f1d0e9c7b5a3f1e2d4c6b8a0f9e7d5c3b1a29384756";

    #[test]
    fn names_come_from_each_runtimes_state_and_corrupt_state_names_nothing() {
        let dir = std::env::temp_dir().join(format!("sp-containers-{}", std::process::id()));
        let docker = dir.join("docker");
        let podman = dir.join("podman");
        std::fs::create_dir_all(docker.join("containers").join(ID)).unwrap();
        std::fs::create_dir_all(podman.join("overlay-containers")).unwrap();
        std::fs::write(
            docker.join("containers").join(ID).join("config.v2.json"),
            r#"{"ID":"x","Name":"/db","State":{}}"#,
        )
        .unwrap();
        std::fs::write(
            podman.join("overlay-containers").join("containers.json"),
            format!(r#"[{{"id":"other","names":["a"]}},{{"id":"{ID}","names":["web"]}}]"#),
        )
        .unwrap();
        let mut c = Containers::with_roots(StateRoots {
            docker: docker.clone(),
            podman,
        });
        let of = |runtime| Container {
            runtime,
            id: ID.to_string(),
            name: None,
        };
        assert_eq!(c.named(of(Runtime::Docker)).unwrap().label(), "db");
        let mut fresh = Containers::with_roots(c.roots.clone());
        assert_eq!(fresh.named(of(Runtime::Podman)).unwrap().label(), "web");
        assert_eq!(
            fresh.named(of(Runtime::Containerd)).unwrap().label(),
            &ID[..12]
        );
        std::fs::write(
            docker.join("containers").join(ID).join("config.v2.json"),
            "{ not json",
        )
        .unwrap();
        let mut corrupt = Containers::with_roots(c.roots.clone());
        assert_eq!(corrupt.named(of(Runtime::Docker)).unwrap().name, None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
