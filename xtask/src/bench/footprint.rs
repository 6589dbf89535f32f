//! Section 4: memory and start-up. stackprobe's RSS and the kernel memory of
//! its maps while watching one process and about a thousand (a forking
//! server whose children live a second, so pids churn), the time from start to
//! all probes attached; bpftrace's for the same probes beside it.

use std::{
    fmt::Write as _,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::Result;

use super::{
    Scale,
    loopback::{self, Loopback},
    spread,
    tracer::{Tracer, map_bytes},
};

struct Sample {
    attach_ms: f64,
    rss_mib: f64,
    peak_rss_mib: f64,
    map_mib: f64,
    watched: u64,
}

const MIB: f64 = 1024.0 * 1024.0;

/// The probes stackprobe attaches, as bpftrace one-liners on the same server.
const BPFTRACE: &str = r#"tracepoint:syscalls:sys_enter_accept4 /comm == "stackprobe-loop"/ { @a[tid] = nsecs; }
tracepoint:syscalls:sys_exit_accept4 /@a[tid]/ { @accept_ns = hist(nsecs - @a[tid]); delete(@a[tid]); }
tracepoint:syscalls:sys_enter_clone /comm == "stackprobe-loop"/ { @c[tid] = nsecs; }
tracepoint:syscalls:sys_exit_clone /@c[tid]/ { @clone_ns = hist(nsecs - @c[tid]); delete(@c[tid]); }
tracepoint:sock:inet_sock_set_state /args->protocol == 6/ { @states[args->oldstate, args->newstate] = count(); }
tracepoint:sched:sched_process_exit /comm == "stackprobe-loop"/ { @exits = count(); }"#;

fn measure(tracer: Tracer, before_maps: u64, settle: Duration) -> Result<Sample> {
    thread::sleep(settle);
    let (rss, peak) = tracer.rss_kib()?;
    let maps = map_bytes()?.saturating_sub(before_maps);
    let attach_ms = tracer.attach.as_secs_f64() * 1e3;
    let lines = tracer.stop()?;
    // Most processes watched at once, over the intervals.
    let watched = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|r| r["watched"].as_u64())
        .max()
        .unwrap_or(0);
    Ok(Sample {
        attach_ms,
        rss_mib: rss as f64 / 1024.0,
        peak_rss_mib: peak as f64 / 1024.0,
        map_mib: maps as f64 / MIB,
        watched,
    })
}

pub fn run(scale: &Scale) -> Result<String> {
    let rounds = scale.pick(1, 3);
    let mut rows: Vec<(&str, Vec<Sample>)> = Vec::new();
    for (label, churn) in [
        ("stackprobe, 1 process", false),
        ("stackprobe, ~1000 processes (pids churning)", true),
        ("bpftrace, same probes", false),
    ] {
        let mut samples = Vec::new();
        for _ in 0..rounds {
            let maps_before = map_bytes()?;
            let mut server = Loopback::start(&["--max-seconds", "120", "--backlog", "4096"])?;
            let pid = server.pid.to_string();
            let tracer = if label.starts_with("bpftrace") {
                Tracer::bpftrace(BPFTRACE)?
            } else {
                Tracer::stackprobe(&[
                    "watch",
                    "--pid",
                    &pid,
                    "--json",
                    "--no-tui",
                    "--interval",
                    "1s",
                ])?
            };
            if churn {
                // 3000 connections at ~1000/s, children living 1 s: ~1000
                // alive when measured.
                server.send("serve-fork 3000 tcp 1000")?;
                let mut client = Command::new(loopback::bin())
                    .args(["connect", "tcp", &server.addr, "3000"])
                    .stdout(Stdio::null())
                    .spawn()?;
                samples.push(measure(tracer, maps_before, Duration::from_millis(2500))?);
                let _ = client.wait();
            } else {
                samples.push(measure(tracer, maps_before, Duration::from_secs(2))?);
            }
        }
        rows.push((label, samples));
    }
    let mut md = String::from(
        "\n## 4. Footprint\n\n\
         RSS of the tracer a couple of seconds into a run and its peak (stackprobe's is while \
         loading: the kernel's BTF is parsed, then the memory is returned), the kernel memory of the \
         BPF maps it created (`bytes_memlock` from bpftool, all maps minus those before it \
         started), and the time from starting it to all probes attached (stackprobe: its \
         \"probes attached\" line; bpftrace: its BEGIN probe, which runs once every probe is \
         attached, and includes compiling its script). \"~1000 processes\": a server forking a \
         child per connection, each living 1 s, at ~1000 connections/s. Medians. Targets: RSS \
         < 20 MB (steady under the lab's load: section 2) and < 40 MB at its peak; attached in \
         < 300 ms.\n\n\
         | tracer | watched processes | attach ms | RSS MiB | peak RSS MiB | map memory MiB |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    for (label, samples) in &rows {
        let med = |f: &dyn Fn(&Sample) -> f64| spread(&samples.iter().map(f).collect::<Vec<_>>()).0;
        let watched = if label.starts_with("bpftrace") {
            "-".to_string()
        } else {
            format!("{:.0}", med(&|s| s.watched as f64))
        };
        let _ = writeln!(
            md,
            "| {label} | {watched} | {:.0} | {:.1} | {:.1} | {:.1} |",
            med(&|s| s.attach_ms),
            med(&|s| s.rss_mib),
            med(&|s| s.peak_rss_mib),
            med(&|s| s.map_mib)
        );
    }
    Ok(md)
}
