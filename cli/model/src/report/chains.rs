//! The path view: where a request's time goes, hop by hop. Watched roles
//! are linked where one connects to a socket another listens on (the
//! destination and the listener have the same name, as in `paths.rs`);
//! each chain of them (nginx → php-fpm → postgres) is followed from its
//! root along the busiest link, and each hop gets its numbers side by side
//! and, where each request opens one connection to the next hop, its own
//! time: its service time less what the next hop took.
//!
//! Means add up, percentiles do not: own time is computed from means.

use serde::Serialize;

use super::{CountRow, ListenerLatencyRow, Report, RoleRow};
use crate::{
    busy::BusyRow,
    histogram::Summary,
    measure::{Count, Latency},
};

/// Connects to the next hop within this share of a hop's accepts: one
/// connection per request.
pub const PER_REQUEST_TOLERANCE: f64 = 0.1;

/// Connects a link needs in the period before own time is computed.
pub const MIN_REQUESTS: u64 = 20;

/// A chain of watched roles, each connecting to the next.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Chain {
    /// The first hop's role.
    pub root: String,
    /// At least two.
    pub hops: Vec<Hop>,
    /// The role of the hop with the largest own time; null when no hop has
    /// one.
    pub holder: Option<String>,
}

/// One role on a chain, with the link it was reached by.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hop {
    pub role: String,
    /// The container's name, else its short id; null outside containers.
    pub container: Option<String>,
    /// The destinations the previous hop connected to and this role listens
    /// on (empty for the root).
    pub via: Vec<String>,
    /// The previous hop's successful connects to it, summed over `via`
    /// (null for the root).
    pub connect: Option<HopLatency>,
    /// The wait in the listener's queue, the accept and the service time:
    /// over the listeners in `via` (all connections to them, from any
    /// client); the root's over all its listeners.
    pub accept_queue: HopLatency,
    pub accept: HopLatency,
    pub service: HopLatency,
    /// The role's threads' waits for a CPU (over all its processes: a
    /// thread's wait is not a listener's); empty when not measured.
    pub run_queue: HopLatency,
    /// Connections accepted in the period (for the root, untimed ones too).
    pub accepts: u64,
    pub forks_per_accept: Option<f64>,
    /// The connections its server held (null until the collector fills it).
    pub busy: Option<BusyRow>,
    /// Connections lost at the full queue of those listeners; null where
    /// no listener's count is known.
    pub lost: Option<CountRow>,
    /// Its mean service time less the next hop's mean connect, queue wait
    /// and service time (weighted by connects per accept); the last hop's
    /// is its mean service time. Null where a link is not one connection
    /// per request (see `note`).
    pub own_ns: Option<u64>,
    /// Why `own_ns` is null, or what to know about it.
    pub note: Option<String>,
}

/// A latency summed over several rows: its count, exact mean and max, and
/// its p99 when a single row holds every sample (percentiles do not add).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HopLatency {
    pub count: u64,
    pub mean_ns: u64,
    pub max_ns: u64,
    pub p99_ns: Option<u64>,
}

impl HopLatency {
    fn sum<'a>(rows: impl IntoIterator<Item = &'a Summary>) -> Self {
        let rows: Vec<&Summary> = rows.into_iter().filter(|s| s.count > 0).collect();
        let count: u64 = rows.iter().map(|s| s.count).sum();
        if count == 0 {
            return Self::default();
        }
        let sum: u128 = rows
            .iter()
            .map(|s| u128::from(s.mean_ns) * u128::from(s.count))
            .sum();
        Self {
            count,
            mean_ns: (sum / u128::from(count)) as u64,
            max_ns: rows.iter().map(|s| s.max_ns).max().unwrap_or(0),
            p99_ns: match rows.as_slice() {
                [one] => Some(one.p99_ns),
                _ => None,
            },
        }
    }
}

/// Rebuilds `report.chains` from its roles: for the collector, once it has
/// filled what [`Report::build`] leaves empty (each role's `busy`, unix
/// listeners' `lost`).
pub fn link_chains(report: &mut Report) {
    report.chains = chains(&report.roles);
}

/// A link: `to` (an index into the roles) over `via`, with its successful
/// connects in the period and since the start.
struct Link {
    to: usize,
    via: Vec<String>,
    connects: u64,
    total: u64,
    /// The connects' latencies, one per destination in `via`.
    latencies: Vec<Summary>,
}

/// The links out of `from`: per other role listening on destinations it
/// connected to (successfully, at some point since the start), busiest
/// first.
fn links_from(roles: &[RoleRow], from: usize) -> Vec<Link> {
    let mut out: Vec<Link> = Vec::new();
    for c in &roles[from].connects {
        if c.connects().total == 0 {
            continue;
        }
        for (to, server) in roles.iter().enumerate() {
            if to == from || !server.listeners.iter().any(|l| l.listener == c.destination) {
                continue;
            }
            let link = match out.iter_mut().position(|l| l.to == to) {
                Some(i) => &mut out[i],
                None => {
                    out.push(Link {
                        to,
                        via: Vec::new(),
                        connects: 0,
                        total: 0,
                        latencies: Vec::new(),
                    });
                    out.last_mut().expect("just pushed")
                }
            };
            link.via.push(c.destination.clone());
            link.connects += c.connects().latency.count;
            link.total += c.connects().total;
            link.latencies.push(c.connects().latency);
        }
    }
    out.sort_by(|a, b| {
        (b.connects, b.total)
            .cmp(&(a.connects, a.total))
            .then(roles[a.to].role.cmp(&roles[b.to].role))
    });
    out
}

/// Every chain: from each root (a role with listeners that no other
/// watched role connects to; if there is none, each role with links, the
/// busiest first) along the busiest link to a role not yet on the chain.
/// A role already on a chain starts none; a chain has two hops or more.
pub(super) fn chains(roles: &[RoleRow]) -> Vec<Chain> {
    let links: Vec<Vec<Link>> = (0..roles.len()).map(|i| links_from(roles, i)).collect();
    let reached: Vec<bool> = (0..roles.len())
        .map(|i| links.iter().flatten().any(|l| l.to == i))
        .collect();
    let mut roots: Vec<usize> = (0..roles.len())
        .filter(|&i| !roles[i].listeners.is_empty() && !reached[i])
        .collect();
    if roots.is_empty() {
        roots = (0..roles.len()).filter(|&i| !links[i].is_empty()).collect();
        let out = |i: usize| {
            links[i]
                .iter()
                .fold((0, 0), |(n, t), l| (n + l.connects, t + l.total))
        };
        roots.sort_by(|&a, &b| out(b).cmp(&out(a)).then(roles[a].role.cmp(&roles[b].role)));
    }
    let mut on_chain = vec![false; roles.len()];
    let mut chains = Vec::new();
    for root in roots {
        if on_chain[root] {
            continue;
        }
        let mut path: Vec<(usize, Option<&Link>)> = vec![(root, None)];
        let mut at = root;
        while let Some(next) = links[at]
            .iter()
            .find(|l| !path.iter().any(|&(i, _)| i == l.to))
        {
            path.push((next.to, Some(next)));
            at = next.to;
        }
        if path.len() < 2 {
            continue;
        }
        for &(i, _) in &path {
            on_chain[i] = true;
        }
        chains.push(chain(roles, &path));
    }
    chains
}

/// One chain's hops, their own times and its holder.
fn chain(roles: &[RoleRow], path: &[(usize, Option<&Link>)]) -> Chain {
    let mut hops: Vec<Hop> = path.iter().map(|&(i, via)| hop(&roles[i], via)).collect();
    // Whether each link (into hop i + 1) is one connection per request;
    // why not, if not.
    let per_request: Vec<Result<(), String>> = hops
        .windows(2)
        .map(|w| one_per_request(&w[0], &w[1]))
        .collect();
    for i in 0..hops.len() {
        let into = if i == 0 {
            Ok(())
        } else {
            per_request[i - 1].clone()
        };
        let own = into.and_then(|()| {
            let service = &hops[i].service;
            if service.count == 0 {
                return Err("no service time measured in the period".to_string());
            }
            let Some(next) = hops.get(i + 1) else {
                return Ok(service.mean_ns as f64);
            };
            per_request[i].clone()?;
            if next.service.count == 0 {
                return Err(format!(
                    "{} has no service time measured in the period",
                    next.role
                ));
            }
            let connect = next.connect.unwrap_or_default();
            let per_accept = connect.count as f64 / hops[i].accepts as f64;
            let downstream =
                (connect.mean_ns + next.accept_queue.mean_ns + next.service.mean_ns) as f64;
            Ok(service.mean_ns as f64 - downstream * per_accept)
        });
        let hop = &mut hops[i];
        match own {
            Ok(ns) if ns < 0.0 => {
                hop.own_ns = Some(0);
                hop.note = Some(format!(
                    "the next hop's time exceeds this hop's service time by {}: shown as 0",
                    crate::histogram::duration((-ns).round() as u64)
                ));
            }
            Ok(ns) => hop.own_ns = Some(ns.round() as u64),
            Err(why) => hop.note = Some(why),
        }
    }
    let holder = hops
        .iter()
        .filter_map(|h| Some((h.own_ns?, h)))
        .max_by_key(|&(ns, _)| ns)
        .map(|(_, h)| h.role.clone());
    Chain {
        root: hops[0].role.clone(),
        hops,
        holder,
    }
}

/// Whether `from` opens one connection to `to` per request it accepts:
/// its successful connects to it within [`PER_REQUEST_TOLERANCE`] of its
/// accepts in the period, and at least [`MIN_REQUESTS`] of them.
fn one_per_request(from: &Hop, to: &Hop) -> Result<(), String> {
    let connects = to.connect.map_or(0, |c| c.count);
    let accepts = from.accepts;
    if accepts == 0 {
        return Err(format!("{} accepted nothing in the period", from.role));
    }
    if accepts >= MIN_REQUESTS
        && (connects as f64 - accepts as f64).abs() > PER_REQUEST_TOLERANCE * accepts as f64
    {
        return Err(format!(
            "{} made {connects} connects to {} for {accepts} accepted connections: not one per request (keepalive or pooling), so service times are connections' lifetimes, not requests'",
            from.role, to.role
        ));
    }
    if connects < MIN_REQUESTS {
        return Err(format!(
            "{connects} connects from {} to {} in the period: too few to tell (at least {MIN_REQUESTS})",
            from.role, to.role
        ));
    }
    Ok(())
}

/// A role's numbers on a chain: over the listeners it was reached by, or,
/// for the root and for a role whose every listener with accepts was
/// reached, the role's own (which also hold what accepts of an unknown
/// listener measured: threads already blocked in accept() at attach).
fn hop(r: &RoleRow, link: Option<&Link>) -> Hop {
    let whole = link.is_none_or(|link| {
        r.listeners
            .iter()
            .filter(|l| l.latency[Latency::Accept].total > 0)
            .all(|l| link.via.contains(&l.listener))
    });
    let link_only = if whole { None } else { link };
    let listeners: Vec<&ListenerLatencyRow> = match link {
        Some(link) => r
            .listeners
            .iter()
            .filter(|l| link.via.contains(&l.listener))
            .collect(),
        None => r.listeners.iter().collect(),
    };
    let over = |latency: Latency| match link_only {
        Some(_) => HopLatency::sum(listeners.iter().map(|l| &l.latency[latency].latency)),
        None => HopLatency::sum([&r.latency[latency].latency]),
    };
    let accept = over(Latency::Accept);
    let accepts = match link_only {
        Some(_) => accept.count,
        None => accept.count + r.counts[Count::AcceptUntimed].count,
    };
    let lost = listeners
        .iter()
        .filter_map(|l| l.lost)
        .reduce(|a, b| CountRow {
            count: a.count + b.count,
            total: a.total + b.total,
        });
    let connect = link.map(|link| HopLatency::sum(&link.latencies));
    Hop {
        role: r.role.clone(),
        container: r.container.clone(),
        via: link.map(|l| l.via.clone()).unwrap_or_default(),
        connect,
        accept_queue: over(Latency::AcceptQueue),
        accept,
        service: over(Latency::Service),
        run_queue: HopLatency::sum([&r.latency[Latency::RunQueue].latency]),
        accepts,
        forks_per_accept: r.forks_per_accept,
        busy: r.busy.clone(),
        lost,
        own_ns: None,
        note: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        fixtures::{self, PathHop, live, request_path, three_hop_path, three_hops},
        process::ProcessTable,
    };

    fn own(c: &Chain) -> Vec<(&str, Option<u64>)> {
        c.hops.iter().map(|h| (h.role.as_str(), h.own_ns)).collect()
    }

    #[test]
    fn three_hops_one_connection_per_request_give_each_hops_own_time() {
        let mut t = ProcessTable::default();
        three_hops(&mut t, 100);
        let r = fixtures::interval_report(&t);
        let [c] = r.chains.as_slice() else {
            panic!("{:#?}", r.chains)
        };
        assert_eq!(c.root, "nginx");
        assert_eq!(
            own(c),
            [
                ("nginx", Some(7_960_000)),
                ("php-fpm", Some(28_985_000)),
                ("postgres", Some(50_000_000)),
            ]
        );
        assert_eq!(c.holder.as_deref(), Some("postgres"));
        let [nginx, php, pg] = &c.hops[..] else {
            unreachable!()
        };
        assert!(nginx.via.is_empty() && nginx.connect.is_none());
        assert_eq!(php.via, ["/run/php/php-fpm.sock"]);
        assert_eq!(pg.via, ["127.0.0.1:5432"]);
        assert_eq!(
            php.connect,
            Some(HopLatency {
                count: 100,
                mean_ns: 40_000,
                max_ns: 40_000,
                p99_ns: php.connect.and_then(|c| c.p99_ns),
            })
        );
        assert_eq!(
            (php.accept_queue.mean_ns, php.service.mean_ns),
            (12_000_000, 80_000_000)
        );
        assert_eq!((nginx.accepts, php.accepts, pg.accepts), (100, 100, 100));
        assert!(c.hops.iter().all(|h| h.note.is_none()), "{c:#?}");
    }

    #[test]
    fn each_hop_has_its_roles_run_queue_wait() {
        use crate::{event::HistMetric, fixtures::kernel_hist};
        let mut t = ProcessTable::default();
        three_hops(&mut t, 100);
        t.apply(&kernel_hist(
            12,
            "php-fpm",
            HistMetric::RunQueue,
            &[1_000_000, 3_000_000],
        ));
        let r = fixtures::interval_report(&t);
        let waits: Vec<(u64, u64, u64)> = r.chains[0]
            .hops
            .iter()
            .map(|h| (h.run_queue.count, h.run_queue.mean_ns, h.run_queue.max_ns))
            .collect();
        assert_eq!(waits, [(0, 0, 0), (2, 2_000_000, 3_000_000), (0, 0, 0)]);
        assert!(r.chains[0].hops[1].run_queue.p99_ns.is_some());
    }

    #[test]
    fn a_hop_that_pools_its_connections_has_no_own_time_and_says_why() {
        // php-fpm keeps persistent connections: 5 connects to postgres for
        // its 100 requests.
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(11, "nginx"), live(12, "php-fpm"), live(13, "postgres")]);
        request_path(&mut t, &three_hop_path(100, 5));
        let r = fixtures::interval_report(&t);
        let [c] = r.chains.as_slice() else {
            panic!("{:#?}", r.chains)
        };
        assert_eq!(
            own(c),
            [
                ("nginx", Some(7_960_000)),
                ("php-fpm", None),
                ("postgres", None)
            ]
        );
        assert_eq!(c.holder.as_deref(), Some("nginx"));
        let note = c.hops[1].note.as_deref().unwrap_or_default();
        assert!(
            note.contains("php-fpm made 5 connects to postgres for 100 accepted connections")
                && note.contains("keepalive or pooling"),
            "{note}"
        );
        assert_eq!(c.hops[2].note.as_deref(), Some(note));
    }

    #[test]
    fn too_few_requests_give_no_own_time() {
        let mut t = ProcessTable::default();
        three_hops(&mut t, 10);
        let r = fixtures::interval_report(&t);
        assert_eq!(r.chains.len(), 1);
        assert!(r.chains[0].hops.iter().all(|h| h.own_ns.is_none()));
        assert_eq!(r.chains[0].holder, None);
        assert!(
            r.chains[0].hops[0]
                .note
                .as_deref()
                .is_some_and(|n| n.contains("too few")),
            "{:#?}",
            r.chains[0]
        );
    }

    #[test]
    fn a_cycle_is_followed_once_and_ends() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "alpha"), live(2, "beta"), live(3, "gamma")]);
        let hop = |pid, name, listener, next, connects| PathHop {
            pid,
            name,
            listener,
            accepts: 30,
            queue_ns: 1_000,
            service_ns: 1_000_000,
            next: Some(next),
            connects,
            connect_ns: 10_000,
        };
        request_path(
            &mut t,
            &[
                hop(1, "alpha", "127.0.0.1:1", "127.0.0.1:2", 30),
                hop(2, "beta", "127.0.0.1:2", "127.0.0.1:3", 25),
                hop(3, "gamma", "127.0.0.1:3", "127.0.0.1:1", 20),
            ],
        );
        let r = fixtures::interval_report(&t);
        let chains: Vec<Vec<&str>> = r
            .chains
            .iter()
            .map(|c| c.hops.iter().map(|h| h.role.as_str()).collect())
            .collect();
        // No role is a root (each is connected to): the one connecting most
        // starts the only chain, which stops before coming back to it.
        assert_eq!(chains, [["alpha", "beta", "gamma"]]);
    }

    #[test]
    fn roles_that_do_not_connect_to_each_other_have_no_chain() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "web"), live(2, "db")]);
        let alone = |pid, name, listener| PathHop {
            pid,
            name,
            listener,
            accepts: 50,
            queue_ns: 1_000,
            service_ns: 1_000_000,
            next: Some("10.0.0.9:6379"),
            connects: 50,
            connect_ns: 10_000,
        };
        request_path(
            &mut t,
            &[
                alone(1, "web", "0.0.0.0:80"),
                alone(2, "db", "127.0.0.1:5432"),
            ],
        );
        let r = fixtures::interval_report(&t);
        assert_eq!(r.roles.len(), 2);
        assert!(r.chains.is_empty(), "{:#?}", r.chains);
    }

    #[test]
    fn linking_again_takes_in_what_the_collector_filled() {
        let mut t = ProcessTable::default();
        three_hops(&mut t, 100);
        let mut r = fixtures::interval_report(&t);
        assert!(r.chains[0].hops.iter().all(|h| h.busy.is_none()));
        let php = r.roles.iter_mut().find(|r| r.role == "php-fpm").unwrap();
        php.busy = Some(BusyRow {
            mean: 2.0,
            max: 2,
            now: 2,
            processes: 2,
            limit: None,
        });
        php.listeners[0].lost = Some(CountRow { count: 3, total: 7 });
        link_chains(&mut r);
        let hop = &r.chains[0].hops[1];
        assert_eq!(hop.busy.as_ref().map(|b| b.max), Some(2));
        assert_eq!(hop.lost, Some(CountRow { count: 3, total: 7 }));
    }
}
