//! Which container a process runs in, from its cgroup v2 path
//! (`/proc/PID/cgroup`'s `0::` line) as the runtimes name them: Docker's
//! `docker-<id>.scope` (or `/docker/<id>`), Podman's `libpod-<id>.scope`,
//! containerd's `cri-containerd-<id>.scope` and CRI-O's `crio-<id>.scope`
//! (Kubernetes pods, under `kubepods…`). The name, where the runtime's state
//! on this host says it, is looked up by the collector.

use std::fmt;

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Docker,
    Podman,
    Containerd,
    Crio,
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Runtime::Docker => "docker",
            Runtime::Podman => "podman",
            Runtime::Containerd => "containerd",
            Runtime::Crio => "crio",
        })
    }
}

/// A container: its runtime, its full id, and its name when known.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Container {
    pub runtime: Runtime,
    pub id: String,
    pub name: Option<String>,
}

/// How many hex digits of an id are shown, as `docker ps` does.
pub const SHORT_ID: usize = 12;

impl Container {
    /// The container of a process whose cgroup v2 path is `path`, if the
    /// path is a container runtime's.
    pub fn from_cgroup(path: &str) -> Option<Container> {
        // The innermost container scope names it (a pod's containers sit
        // under the pod's slice).
        path.rsplit('/').find_map(|part| {
            let part = part.strip_suffix(".scope").unwrap_or(part);
            let (runtime, id) = [
                ("docker-", Runtime::Docker),
                ("libpod-", Runtime::Podman),
                ("cri-containerd-", Runtime::Containerd),
                ("crio-", Runtime::Crio),
            ]
            .into_iter()
            .find_map(|(prefix, runtime)| Some((runtime, part.strip_prefix(prefix)?)))
            .or_else(|| {
                // cgroupfs-driver Docker: /docker/<id>.
                path.contains("/docker/").then_some((Runtime::Docker, part))
            })?;
            is_id(id).then(|| Container {
                runtime,
                id: id.to_string(),
                name: None,
            })
        })
    }

    /// The name, else the short id: what the views show.
    pub fn label(&self) -> &str {
        self.name
            .as_deref()
            .unwrap_or(&self.id[..SHORT_ID.min(self.id.len())])
    }

    /// Whether `wanted` names this container: its name, its full id or a
    /// prefix of it (at least 4 digits, as `docker` accepts).
    pub fn matches(&self, wanted: &str) -> bool {
        self.name.as_deref() == Some(wanted) || (wanted.len() >= 4 && self.id.starts_with(wanted))
    }
}

/// 64 lowercase hex digits, as every runtime here makes ids.
fn is_id(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A role as shown for processes in `container`: the role, then the
/// container's label in brackets. Roles are counted per (container, role).
pub fn role_in(role: String, container: Option<&Container>) -> String {
    match container {
        Some(c) => format!("{role} [{}]", c.label()),
        None => role,
    }
}

/// The role without its container part (see [`role_in`]).
pub fn bare_role(role: &str) -> &str {
    split_role(role).0
}

/// A role's two parts (see [`role_in`]): the role, and the container's label.
pub fn split_role(role: &str) -> (&str, Option<&str>) {
    match role.rsplit_once(" [") {
        Some((bare, rest)) if rest.ends_with(']') => (bare, Some(&rest[..rest.len() - 1])),
        _ => (role, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f2a9c1be07d5e3c8a6b2f1d0e9c7b5a3f1e2d4c6b8a0f9e7d5c3b1a29384756";

    #[test]
    fn each_runtimes_cgroup_names_its_container() {
        for (path, runtime) in [
            (format!("/system.slice/docker-{ID}.scope"), Runtime::Docker),
            (format!("/docker/{ID}"), Runtime::Docker),
            (
                format!("/machine.slice/libpod-{ID}.scope/container"),
                Runtime::Podman,
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-{ID}.scope"
                ),
                Runtime::Containerd,
            ),
            (
                format!("/kubepods/besteffort/pod1234/crio-{ID}.scope"),
                Runtime::Crio,
            ),
        ] {
            let c = Container::from_cgroup(&path).unwrap_or_else(|| panic!("{path}"));
            assert_eq!((c.runtime, c.id.as_str()), (runtime, ID), "{path}");
            assert_eq!(c.label(), &ID[..12]);
        }
    }

    #[test]
    fn host_processes_and_services_are_in_no_container() {
        for path in [
            "/",
            "/user.slice/user-0.slice/session-3.scope",
            "/system.slice/nginx.service",
            "/system.slice/docker-short.scope",
            "/system.slice/docker.service",
        ] {
            assert_eq!(Container::from_cgroup(path), None, "{path}");
        }
    }

    #[test]
    fn a_container_is_named_by_its_name_or_an_id_prefix_and_roles_split_by_it() {
        let mut c = Container::from_cgroup(&format!("/docker/{ID}")).unwrap();
        assert!(c.matches(&ID[..4]) && c.matches(ID) && !c.matches("4f2"));
        c.name = Some("db".into());
        assert!(c.matches("db") && !c.matches("web"));
        let role = role_in("postgres postmaster".into(), Some(&c));
        assert_eq!(role, "postgres postmaster [db]");
        assert_eq!(bare_role(&role), "postgres postmaster");
        assert_eq!(split_role(&role), ("postgres postmaster", Some("db")));
        assert_eq!(bare_role("nginx master"), "nginx master");
    }
}
