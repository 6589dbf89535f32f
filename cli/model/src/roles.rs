//! Roles group the pids of forking servers: postgres's postmaster and its
//! backends, nginx's and php-fpm's master and workers, and for anything else a
//! master (a process that forks children with its own name) and its workers.

use super::selector::strip_version;

/// The role of a process, from its name, its title (the argv[0] it set, as
/// /proc/PID/cmdline shows it), the name of its parent, and whether it has
/// forked children with its own name.
///
/// A master is told by what it does (forking children of its name) before
/// its parent: a daemonizing server's master is the child of a process with
/// its own name (nginx and php-fpm fork it and exit), and must not read as
/// one of its own workers. (Not by its `master process` title: a worker
/// shows its master's title until it sets its own.)
pub fn role(
    name: &str,
    title: Option<&str>,
    parent_name: Option<&str>,
    forks_own_name: bool,
) -> String {
    let base = strip_version(name);
    if forks_own_name {
        return match base {
            "postgres" | "postmaster" => format!("{name} postmaster"),
            _ => format!("{name} master"),
        };
    }
    let child_of_same = parent_name.is_some_and(|p| p == name);
    if child_of_same {
        return match base {
            "postgres" => format!("{name} backend"),
            "php-fpm" => match title.and_then(php_fpm_pool) {
                Some(pool) => format!("{name} pool {pool}"),
                None => format!("{name} worker"),
            },
            _ => format!("{name} worker"),
        };
    }
    name.to_string()
}

/// Whether `title` is final for the role of a process named `name` that is
/// not a master: a php-fpm worker is forked with its master's title and
/// names its pool a moment later, so until then its role is not known; no
/// other role depends on the title.
pub fn title_settled(name: &str, title: &str) -> bool {
    strip_version(name) != "php-fpm" || php_fpm_pool(title).is_some()
}

/// Whether the role of a process named `name` can depend on its title
/// (see [`title_settled`]).
pub fn reads_title(name: &str) -> bool {
    !title_settled(name, "")
}

/// The kind of a role, for what can be said about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// postgres's postmaster: accepts and forks a backend per connection.
    Postmaster,
    /// nginx's master or workers.
    Nginx,
    /// php-fpm's master or pool workers.
    PhpFpm,
    /// Anything else.
    Generic,
}

/// The kind of `role` (as [`role`] names it).
pub fn kind(role: &str) -> Kind {
    let role = super::containers::bare_role(role);
    let name = role.split(' ').next().unwrap_or(role);
    match strip_version(name) {
        _ if role.ends_with(" postmaster") => Kind::Postmaster,
        "nginx" => Kind::Nginx,
        "php-fpm" => Kind::PhpFpm,
        _ => Kind::Generic,
    }
}

/// `php-fpm: pool www` → `www`.
fn php_fpm_pool(title: &str) -> Option<&str> {
    let pool = title.split_once("pool ")?.1.split_whitespace().next()?;
    (!pool.is_empty()).then_some(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_postmaster_and_backends() {
        assert_eq!(
            role("postgres", None, Some("systemd"), true),
            "postgres postmaster"
        );
        assert_eq!(
            role(
                "postgres",
                Some("postgres: app db 127.0.0.1(5) idle"),
                Some("postgres"),
                false
            ),
            "postgres backend"
        );
        assert_eq!(role("postgres", None, Some("systemd"), false), "postgres");
    }

    #[test]
    fn php_fpm_pools_from_the_title() {
        assert_eq!(
            role(
                "php-fpm8.2",
                Some("php-fpm: master process (/etc/php/8.2/fpm/php-fpm.conf)"),
                Some("systemd"),
                true
            ),
            "php-fpm8.2 master"
        );
        assert_eq!(
            role(
                "php-fpm8.2",
                Some("php-fpm: pool www"),
                Some("php-fpm8.2"),
                false
            ),
            "php-fpm8.2 pool www"
        );
        assert_eq!(
            role("php-fpm8.2", None, Some("php-fpm8.2"), false),
            "php-fpm8.2 worker"
        );
    }

    #[test]
    fn generic_master_and_workers() {
        assert_eq!(
            role(
                "nginx",
                Some("nginx: master process /usr/sbin/nginx"),
                Some("systemd"),
                true
            ),
            "nginx master"
        );
        assert_eq!(
            role("nginx", Some("nginx: worker process"), Some("nginx"), false),
            "nginx worker"
        );
        assert_eq!(role("myd", None, Some("bash"), true), "myd master");
        assert_eq!(role("myd", None, Some("myd"), false), "myd worker");
        // A child that exec'd something else is its own role.
        assert_eq!(role("sh", None, Some("myd"), false), "sh");
    }

    #[test]
    fn a_daemonized_master_is_a_master_though_its_parent_has_its_name() {
        // nginx and php-fpm fork their master and exit: the master's parent
        // has its name, as its workers' parent does.
        let title = Some("php-fpm: master process (/etc/php/8.2/fpm/php-fpm.conf)");
        assert_eq!(
            role("php-fpm8.2", title, Some("php-fpm8.2"), true),
            "php-fpm8.2 master"
        );
        assert_eq!(role("nginx", None, Some("nginx"), true), "nginx master");
        // A worker that has not set its title yet shows its master's: still
        // a worker, with its pool not known yet.
        assert_eq!(
            role("php-fpm8.2", title, Some("php-fpm8.2"), false),
            "php-fpm8.2 worker"
        );
    }

    #[test]
    fn only_a_php_fpm_workers_title_can_still_change_its_role() {
        let inherited = "php-fpm: master process (/etc/php/8.2/fpm/php-fpm.conf)";
        assert!(!title_settled("php-fpm8.2", inherited));
        assert!(title_settled("php-fpm8.2", "php-fpm: pool www"));
        assert!(title_settled(
            "nginx",
            "nginx: master process /usr/sbin/nginx"
        ));
        assert!(title_settled("postgres", "postgres: checkpointer"));
    }

    #[test]
    fn a_title_moves_a_role_only_for_names_that_read_it() {
        // If the role of a name that reads no title moved with its title,
        // a process whose title is never read would take the wrong role.
        let titles = [
            None,
            Some("php-fpm: pool www"),
            Some("postgres: app db 127.0.0.1(5) idle"),
            Some("nginx: worker process"),
        ];
        for name in ["postgres", "nginx", "php-fpm8.2", "php-fpm", "myd"] {
            for parent in [None, Some(name), Some("systemd")] {
                for forks in [false, true] {
                    let untitled = role(name, None, parent, forks);
                    let moved = titles
                        .iter()
                        .any(|&t| role(name, t, parent, forks) != untitled);
                    assert!(!moved || reads_title(name), "{name} {parent:?} {forks}");
                }
            }
        }
        assert!(reads_title("php-fpm8.2"));
        assert!(!reads_title("postgres"));
    }

    #[test]
    fn kinds_of_roles() {
        assert_eq!(kind("postgres postmaster"), Kind::Postmaster);
        assert_eq!(kind("postgres backend"), Kind::Generic);
        assert_eq!(kind("nginx worker"), Kind::Nginx);
        assert_eq!(kind("nginx master"), Kind::Nginx);
        assert_eq!(kind("php-fpm8.2 pool www"), Kind::PhpFpm);
        assert_eq!(kind("php-fpm8.2 master"), Kind::PhpFpm);
        assert_eq!(kind("demo-forking master"), Kind::Generic);
        assert_eq!(kind("myd"), Kind::Generic);
    }
}
