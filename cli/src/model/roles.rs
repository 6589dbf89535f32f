//! Roles group the pids of forking servers: postgres's postmaster and its
//! backends, nginx's and php-fpm's master and workers, and for anything else a
//! master (a process that forks children with its own name) and its workers.

use super::selector::strip_version;

/// The role of a process, from its name, its title (the argv[0] it set, as
/// /proc/PID/cmdline shows it), the name of its parent, and whether it has
/// forked children with its own name.
pub fn role(
    name: &str,
    title: Option<&str>,
    parent_name: Option<&str>,
    forks_own_name: bool,
) -> String {
    let base = strip_version(name);
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
    if forks_own_name {
        return match base {
            "postgres" | "postmaster" => format!("{name} postmaster"),
            _ => format!("{name} master"),
        };
    }
    name.to_string()
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
}
