//! The measurement registry: every latency metric and every count a role or
//! process reports is declared here once, with its name, unit, help and the
//! kernel histogram it comes from. The model's storage ([`Latencies`],
//! [`Counts`]), the report rows and their JSON fields, recordings,
//! Prometheus families and the views' rows are derived from these tables,
//! so a new measurement is its declaration, its probe and its tests.

use std::ops::{Index, IndexMut};

use probes_common::hist::HistMetric;
use serde::{Serialize, Serializer};

/// Where a measurement is kept apart, besides per process and per role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Per {
    /// Only per process and role.
    Process,
    /// Also per listening socket accepted from.
    Listener,
    /// Also per connect destination.
    Destination,
}

/// One measurement's declaration.
#[derive(Debug)]
pub struct Decl {
    /// The JSON field, the recording's `metric=` tag and the Prometheus
    /// `metric` label: never renamed (recordings and dashboards use it).
    pub name: &'static str,
    /// "ns" for latencies, else what is counted.
    pub unit: &'static str,
    /// How the text report names it.
    pub label: &'static str,
    /// The dashboard's shorter name for it.
    pub short: &'static str,
    /// One sentence: Prometheus' HELP, and the docs' meaning.
    pub help: &'static str,
    pub per: Per,
    /// The kernel histogram it is read from (None: counted in userspace).
    pub kernel: Option<HistMetric>,
}

/// Declares an enum of measurements and the table of their declarations,
/// in one order that indexes both.
macro_rules! registry {
    ($(#[$doc:meta])* $enum:ident, $table:ident, $store:ident {
        $($variant:ident => $decl:expr,)+
    }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $enum {
            $($variant,)+
        }

        pub const $table: &[($enum, Decl)] = &[$(($enum::$variant, $decl),)+];

        impl $enum {
            pub const ALL: &[$enum] = &[$($enum::$variant,)+];

            pub fn decl(self) -> &'static Decl {
                &$table[self as usize].1
            }

            pub fn name(self) -> &'static str {
                self.decl().name
            }

            /// The measurement recorded under `name`, if this build knows it.
            pub fn named(name: &str) -> Option<Self> {
                $table.iter().find(|(_, d)| d.name == name).map(|&(m, _)| m)
            }
        }

        /// One value per measurement of [`$enum`], indexed by it.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct $store<T>(pub [T; $table.len()]);

        impl<T> $store<T> {
            pub fn iter(&self) -> impl Iterator<Item = ($enum, &T)> {
                $enum::ALL.iter().copied().zip(&self.0)
            }

            pub fn iter_mut(&mut self) -> impl Iterator<Item = ($enum, &mut T)> {
                $enum::ALL.iter().copied().zip(&mut self.0)
            }

            pub fn map<U>(&self, f: impl FnMut(&T) -> U) -> $store<U> {
                $store(self.0.each_ref().map(f))
            }
        }

        impl<T> Index<$enum> for $store<T> {
            type Output = T;
            fn index(&self, m: $enum) -> &T {
                &self.0[m as usize]
            }
        }

        impl<T> IndexMut<$enum> for $store<T> {
            fn index_mut(&mut self, m: $enum) -> &mut T {
                &mut self.0[m as usize]
            }
        }

        /// A map from each declared name to its value: flattened into a
        /// row, each measurement is a field of its own.
        impl<T: Serialize> Serialize for $store<T> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.iter().map(|(m, v)| (m.name(), v)))
            }
        }
    };
}

registry! {
    /// A latency, kept as a histogram.
    Latency, LATENCIES, Latencies {
        Accept => Decl {
            name: "accept",
            unit: "ns",
            label: "accept latency",
            short: "accept",
            help: "Latency of accept() calls that returned a connection.",
            per: Per::Listener,
            kernel: Some(HistMetric::Accept),
        },
        AcceptQueue => Decl {
            name: "accept_queue",
            unit: "ns",
            label: "accept queue",
            short: "accept queue",
            help: "Time accepted connections waited in the listener's queue: TCP from the handshake completing, unix from the connection being queued, to accept() returning them.",
            per: Per::Listener,
            kernel: Some(HistMetric::AcceptQueue),
        },
        Service => Decl {
            name: "service",
            unit: "ns",
            label: "service time",
            short: "service",
            help: "How long the server held each connection it accepted, from accept() returning it: TCP to the server's first FIN (its close or shutdown) or a reset; unix (with --unix-service-time) to the close of its last reference, or the exit of the process holding it. A request's service time where each request has a connection of its own; a connection's lifetime with keepalive or pooling.",
            per: Per::Listener,
            kernel: Some(HistMetric::Service),
        },
        Fork => Decl {
            name: "fork",
            unit: "ns",
            label: "fork latency",
            short: "fork",
            help: "Latency of clone/fork calls that created a process, as the parent sees it.",
            per: Per::Process,
            kernel: Some(HistMetric::Fork),
        },
        Thread => Decl {
            name: "thread",
            unit: "ns",
            label: "thread latency",
            short: "thread",
            help: "Latency of clone calls that created a thread.",
            per: Per::Process,
            kernel: Some(HistMetric::Thread),
        },
        ChildLifetime => Decl {
            name: "child_lifetime",
            unit: "ns",
            label: "child lifetime",
            short: "child life",
            help: "Lifetime (fork to exit) of the children that exited.",
            per: Per::Process,
            kernel: None,
        },
        Connect => Decl {
            name: "connect",
            unit: "ns",
            label: "connect latency",
            short: "connect",
            help: "Latency of successful connects: TCP from the SYN to ESTABLISHED, unix the connect() call.",
            per: Per::Destination,
            kernel: Some(HistMetric::Connect),
        },
        Held => Decl {
            name: "held",
            unit: "ns",
            label: "connection held",
            short: "held",
            help: "How long the client held each TCP connection it opened, from its SYN to its first FIN (its close or shutdown) or a reset: a request's time at the next hop where each request opens a connection of its own; a pooled connection's lifetime otherwise. Unix connections are not followed to their close.",
            per: Per::Destination,
            kernel: Some(HistMetric::Held),
        },
        RunQueue => Decl {
            name: "run_queue",
            unit: "ns",
            label: "run-queue wait",
            short: "runq",
            help: "Time the threads were runnable but waited for a CPU: from a wakeup, or from being preempted while still runnable, to running (the scheduler's run-queue latency).",
            per: Per::Process,
            kernel: Some(HistMetric::RunQueue),
        },
        OnCpu => Decl {
            name: "on_cpu",
            unit: "ns",
            label: "on CPU",
            short: "on cpu",
            help: "Time the threads ran each time they got a CPU, from the switch-in to the switch-out: the sum is the CPU time of the slices that ended in the interval.",
            per: Per::Process,
            kernel: Some(HistMetric::OnCpu),
        },
    }
}

registry! {
    /// A plain count, for the interval and since the start.
    Count, COUNTS, Counts {
        AcceptUntimed => Decl {
            name: "accept_untimed",
            unit: "accepts",
            label: "accepts of unknown latency",
            short: "untimed accepts",
            help: "Accepts whose thread was already blocked in accept() when the probes attached, so their latency is unknown (not in accept).",
            per: Per::Process,
            kernel: Some(HistMetric::AcceptUntimed),
        },
        AcceptEmpty => Decl {
            name: "accept_empty",
            unit: "accepts",
            label: "accepts that found none waiting",
            short: "empty accepts",
            help: "Non-blocking accept() calls that found no connection waiting (EAGAIN): workers woken for a connection another took, or polling an empty queue.",
            per: Per::Process,
            kernel: Some(HistMetric::AcceptEmpty),
        },
        ForkUnknown => Decl {
            name: "fork_unknown",
            unit: "clones",
            label: "forks of unseen kind",
            short: "forks of unseen kind",
            help: "Clones started before the probes attached, whose kind (process or thread) was not seen.",
            per: Per::Process,
            kernel: Some(HistMetric::ForkUnknown),
        },
        ForkFailed => Decl {
            name: "fork_failed",
            unit: "clones",
            label: "failed forks",
            short: "failed forks",
            help: "Clone/fork calls that failed.",
            per: Per::Process,
            kernel: Some(HistMetric::ForkFailed),
        },
        Preempted => Decl {
            name: "preempted",
            unit: "switches",
            label: "involuntary switches",
            short: "preempted",
            help: "Times a thread was switched out while still runnable (preempted: involuntary context switches).",
            per: Per::Process,
            kernel: Some(HistMetric::Preempted),
        },
        Execs => Decl {
            name: "execs",
            unit: "execs",
            label: "execs",
            short: "execs",
            help: "Execs by the processes themselves.",
            per: Per::Process,
            kernel: None,
        },
        ChildrenExec => Decl {
            name: "children_exec",
            unit: "execs",
            label: "children exec'd",
            short: "children exec'd",
            help: "Children of the processes that exec'd.",
            per: Per::Process,
            kernel: None,
        },
        Exited => Decl {
            name: "exited",
            unit: "processes",
            label: "exited",
            short: "exited",
            help: "Processes that exited.",
            per: Per::Process,
            kernel: None,
        },
    }
}

/// Every declared name, latencies first.
pub fn names() -> impl Iterator<Item = &'static str> {
    LATENCIES
        .iter()
        .map(|(_, d)| d.name)
        .chain(COUNTS.iter().map(|(_, d)| d.name))
}

/// The latencies kept apart per listening socket or per destination
/// (`PER`, a [`Per`] as u8: see the aliases); in JSON only those are
/// fields.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Kept<T, const PER: u8>(pub Latencies<T>);

/// The latencies kept per listening socket ([`Per::Listener`]).
pub type ListenerLatencies<T> = Kept<T, { Per::Listener as u8 }>;
/// The latencies kept per connect destination ([`Per::Destination`]).
pub type DestinationLatencies<T> = Kept<T, { Per::Destination as u8 }>;

impl<T, const PER: u8> Kept<T, PER> {
    pub fn iter(&self) -> impl Iterator<Item = (Latency, &T)> {
        self.0.iter().filter(|(l, _)| l.decl().per as u8 == PER)
    }
}

impl<T, const PER: u8> Index<Latency> for Kept<T, PER> {
    type Output = T;
    fn index(&self, m: Latency) -> &T {
        &self.0[m]
    }
}

impl<T: Serialize, const PER: u8> Serialize for Kept<T, PER> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter().map(|(m, v)| (m.name(), v)))
    }
}

/// A count kept per connect destination (beside its latencies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DestinationCount {
    Refused,
    Failed,
    /// A unix connect its listener's full queue refused (EAGAIN).
    Lost,
}

/// What a kernel histogram of `metric` feeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feeds {
    Latency(Latency),
    Count(Count),
    Destination(DestinationCount),
}

impl Feeds {
    pub fn of(metric: HistMetric) -> Self {
        if let Some(&(l, _)) = LATENCIES.iter().find(|(_, d)| d.kernel == Some(metric)) {
            return Feeds::Latency(l);
        }
        if let Some(&(c, _)) = COUNTS.iter().find(|(_, d)| d.kernel == Some(metric)) {
            return Feeds::Count(c);
        }
        match metric {
            HistMetric::ConnectRefused => Feeds::Destination(DestinationCount::Refused),
            HistMetric::ConnectFailed => Feeds::Destination(DestinationCount::Failed),
            HistMetric::ConnectLost => Feeds::Destination(DestinationCount::Lost),
            // Every other kernel metric is declared in a table above (the
            // test below holds to that).
            other => unreachable!("{other:?} is declared nowhere"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_in_their_enums_order_and_names_are_unique() {
        for (i, (l, _)) in LATENCIES.iter().enumerate() {
            assert_eq!(*l as usize, i);
        }
        for (i, (c, _)) in COUNTS.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
        let mut names: Vec<&str> = LATENCIES
            .iter()
            .map(|(_, d)| d.name)
            .chain(COUNTS.iter().map(|(_, d)| d.name))
            .collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a name is declared twice");
    }

    #[test]
    fn every_kernel_metric_feeds_one_declared_measurement() {
        let mut m = 0;
        while let Some(metric) = HistMetric::from_u32(m) {
            let fed = Feeds::of(metric);
            match fed {
                Feeds::Latency(l) => assert_eq!(l.decl().kernel, Some(metric)),
                Feeds::Count(c) => assert_eq!(c.decl().kernel, Some(metric)),
                Feeds::Destination(_) => assert!(metric.is_connect()),
            }
            m += 1;
        }
        assert!(m >= 10, "only {m} kernel metrics");
    }

    #[test]
    fn a_store_serializes_as_one_field_per_declared_name() {
        let mut counts = Counts::<u64>::default();
        counts[Count::ForkFailed] = 3;
        let json = serde_json::to_value(&counts).unwrap();
        assert_eq!(json["fork_failed"], 3);
        assert_eq!(json.as_object().unwrap().len(), COUNTS.len());
    }
}
