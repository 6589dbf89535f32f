//! `cargo xtask bench lines`: where each stackprobe program's time goes,
//! by source line, on the lab under load. A program's run time (section 2)
//! says how much; this says on what: `perf` samples every CPU while the
//! load runs, and each sample inside a program's JIT image is mapped back
//! through the kernel's line info (jited address → BPF instruction) to the
//! source line `bpftool prog dump xlated linum` names. Under a postgres fork
//! per request most of a program's time is the first load of a line
//! evicted since its last run; the sample lands on the instruction that
//! waits for it, so the lines named are those whose data is cold.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    fs,
    process::Command,
    thread,
};

use anyhow::{Context as _, Result, bail, ensure};

use super::{
    server::STACKPROBE_ARGS,
    tracer::{Tracer, program_ids, programs},
};
use crate::{
    lab::{self, LoadArgs},
    process,
};

/// perf records and `bpftool` reads programs' line info.
pub const PACKAGES: [&str; 1] = ["linux-perf"];

/// One program's JIT image as the kernel describes it: its functions'
/// address ranges, and for each line-info record the jited address it
/// starts at and the BPF instruction it belongs to.
#[derive(Debug, Default)]
pub struct ProgLines {
    pub functions: Vec<(u64, u64)>,
    /// (jited address, instruction offset), sorted by address.
    pub lines: Vec<(u64, u32)>,
}

impl ProgLines {
    fn contains(&self, ip: u64) -> bool {
        self.functions
            .iter()
            .any(|&(a, len)| ip >= a && ip < a + len)
    }

    /// The instruction whose jited code holds `ip`, if `ip` is this
    /// program's.
    fn instruction(&self, ip: u64) -> Option<u32> {
        if !self.contains(ip) {
            return None;
        }
        let i = self.lines.partition_point(|&(a, _)| a <= ip);
        (i > 0).then(|| self.lines[i - 1].1)
    }
}

/// One source line's samples: in its own code, and in kernel functions it
/// called (a hash lookup, a helper), found by the callchain.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LineSamples {
    pub line: String,
    pub own: u64,
    pub called: u64,
}

/// Samples per source line for `prog`, most first, and its total: `chains`
/// counts samples per callchain (leaf first), `source` names each BPF
/// instruction's source line. A sample is the program's if its leaf is in
/// the program, or a frame the leaf returns to is.
pub fn attribute(
    chains: &HashMap<Vec<u64>, u64>,
    prog: &ProgLines,
    source: &BTreeMap<u32, String>,
) -> (Vec<LineSamples>, u64) {
    let mut per_line: HashMap<&str, (u64, u64)> = HashMap::new();
    let mut total = 0;
    for (chain, &n) in chains {
        let Some((depth, insn)) = chain
            .iter()
            .enumerate()
            .find_map(|(d, &ip)| prog.instruction(ip).map(|i| (d, i)))
        else {
            continue;
        };
        total += n;
        // The nearest instruction at or before it with a source line.
        let line = source
            .range(..=insn)
            .next_back()
            .map_or("?", |(_, s)| s.as_str());
        let e = per_line.entry(line).or_default();
        if depth == 0 {
            e.0 += n;
        } else {
            e.1 += n;
        }
    }
    let mut rows: Vec<LineSamples> = per_line
        .into_iter()
        .map(|(l, (own, called))| LineSamples {
            line: l.to_string(),
            own,
            called,
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.own + b.called)
            .cmp(&(a.own + a.called))
            .then_with(|| a.line.cmp(&b.line))
    });
    (rows, total)
}

/// `bpftool prog dump xlated id N linum`'s text: each instruction's source
/// line, as `file:line code`. Code inlined from a library (aya's map and
/// helper wrappers, core) is named by the project's line before it, the
/// call site, with the library's line after `via`.
pub fn parse_xlated(text: &str) -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut ours = String::from("?");
    for l in text.lines() {
        if let Some(comment) = l.strip_prefix("; ") {
            let (code, at) = comment.rsplit_once(" [file:").unwrap_or((comment, ""));
            let path = at.split_whitespace().next().unwrap_or("?");
            let file = path.rsplit('/').next().unwrap_or(path);
            let line = at
                .split_whitespace()
                .find_map(|w| w.strip_prefix("line_num:"))
                .unwrap_or("?");
            let code: String = code.trim().chars().take(70).collect();
            let here = format!("{file}:{line} `{code}`");
            current = Some(if path.contains("/probes-") {
                ours.clone_from(&here);
                here
            } else {
                format!("{ours} via {file}:{line}")
            });
        } else if let Some((insn, _)) = l.trim_start().split_once(": (")
            && let Ok(insn) = insn.parse::<u32>()
            && let Some(c) = &current
        {
            out.insert(insn, c.clone());
        }
    }
    out
}

// The bpf(2) commands and bpf_prog_info's offsets (include/uapi/linux/bpf.h).
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const INFO_LEN: usize = 232;
const NAME: usize = 64;
const NR_JITED_KSYMS: usize = 104;
const NR_JITED_FUNC_LENS: usize = 108;
const JITED_KSYMS: usize = 112;
const JITED_FUNC_LENS: usize = 120;
const NR_LINE_INFO: usize = 148;
const LINE_INFO: usize = 152;
const JITED_LINE_INFO: usize = 160;
const NR_JITED_LINE_INFO: usize = 168;
const LINE_INFO_REC_SIZE: usize = 172;
const JITED_LINE_INFO_REC_SIZE: usize = 176;

fn bpf(cmd: libc::c_long, attr: &mut [u8]) -> Result<i64> {
    // SAFETY: `attr` is a valid buffer of its length, as bpf(2) takes it.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if r < 0 {
        bail!("bpf({cmd}): {}", std::io::Error::last_os_error());
    }
    Ok(r)
}

fn get_info(fd: i64, info: &mut [u8; INFO_LEN]) -> Result<()> {
    let mut attr = [0u8; 16];
    put32(&mut attr, 0, fd as usize);
    put32(&mut attr, 4, INFO_LEN);
    put_ptr(&mut attr, 8, info);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(|_| ())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn put32(b: &mut [u8], at: usize, v: usize) {
    b[at..at + 4].copy_from_slice(&(v as u32).to_ne_bytes());
}

/// The address of `buf` into a u64 field of bpf_prog_info, where the
/// kernel writes that array.
fn put_ptr<T>(b: &mut [u8], at: usize, buf: &mut [T]) {
    b[at..at + 8].copy_from_slice(&(buf.as_mut_ptr() as u64).to_ne_bytes());
}

/// The JIT image's functions and line info of loaded program `id`.
pub fn prog_lines(id: u64) -> Result<ProgLines> {
    let mut attr = [0u8; 16];
    put32(&mut attr, 0, id as usize);
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?;
    let result = (|| {
        let mut info = [0u8; INFO_LEN];
        get_info(fd, &mut info)?;
        let name = String::from_utf8_lossy(&info[NAME..NAME + 16])
            .trim_end_matches('\0')
            .to_string();
        let n_ksyms = u32_at(&info, NR_JITED_KSYMS) as usize;
        let n_lens = u32_at(&info, NR_JITED_FUNC_LENS) as usize;
        let n_lines = u32_at(&info, NR_LINE_INFO) as usize;
        let n_jited = u32_at(&info, NR_JITED_LINE_INFO) as usize;
        let line_rec = u32_at(&info, LINE_INFO_REC_SIZE) as usize;
        let jited_rec = u32_at(&info, JITED_LINE_INFO_REC_SIZE) as usize;
        ensure!(
            n_lines == n_jited && jited_rec == 8 && line_rec >= 4,
            "program {id} ({name}) has no usable line info"
        );
        let mut ksyms = vec![0u64; n_ksyms];
        let mut lens = vec![0u32; n_lens];
        let mut line_info = vec![0u8; n_lines * line_rec];
        let mut jited = vec![0u64; n_jited];
        let mut ask = [0u8; INFO_LEN];
        put32(&mut ask, NR_JITED_KSYMS, n_ksyms);
        put32(&mut ask, NR_JITED_FUNC_LENS, n_lens);
        put_ptr(&mut ask, JITED_KSYMS, &mut ksyms);
        put_ptr(&mut ask, JITED_FUNC_LENS, &mut lens);
        put32(&mut ask, NR_LINE_INFO, n_lines);
        put_ptr(&mut ask, LINE_INFO, &mut line_info);
        put_ptr(&mut ask, JITED_LINE_INFO, &mut jited);
        put32(&mut ask, NR_JITED_LINE_INFO, n_jited);
        put32(&mut ask, LINE_INFO_REC_SIZE, line_rec);
        put32(&mut ask, JITED_LINE_INFO_REC_SIZE, jited_rec);
        get_info(fd, &mut ask)?;
        let mut lines: Vec<(u64, u32)> = jited
            .iter()
            .enumerate()
            .map(|(i, &a)| (a, u32_at(&line_info, i * line_rec)))
            .collect();
        lines.sort_unstable();
        Ok(ProgLines {
            functions: ksyms
                .into_iter()
                .zip(lens.into_iter().map(u64::from))
                .collect(),
            lines,
        })
    })();
    // SAFETY: `fd` is the descriptor bpf(2) just opened for this call.
    unsafe { libc::close(fd as i32) };
    result
}

/// Samples per callchain (leaf first) in `perf script -F ip`'s output of a
/// `perf record -g`: one frame per line, a blank line after each sample.
pub fn parse_chains(script: &str) -> HashMap<Vec<u64>, u64> {
    let mut chains = HashMap::new();
    let mut chain = Vec::new();
    for l in script.lines().chain([""]) {
        match u64::from_str_radix(l.trim(), 16) {
            Ok(ip) => chain.push(ip),
            Err(_) if !chain.is_empty() => {
                *chains.entry(std::mem::take(&mut chain)).or_default() += 1;
            }
            Err(_) => {}
        }
    }
    chains
}

/// Runs `watch` on the lab under `load`, samples every CPU meanwhile, and
/// returns each program's time by source line, as markdown.
pub fn run(load: &LoadArgs, top: usize) -> Result<String> {
    ensure!(
        process::is_root(),
        "perf and the probes need root: run it as root"
    );
    // Run counts and times: without them every program reads as never run.
    let _stats = super::BpfStats::enable()?;
    let before = program_ids()?;
    let tracer = Tracer::stackprobe(&STACKPROBE_ARGS)?;
    let data = std::env::temp_dir().join(format!("stackprobe-lines-{}.data", std::process::id()));
    let data = data.to_str().context("temp path")?.to_string();
    // perf stops a second before the load does: every sample is under it.
    let record_s = load.seconds.saturating_sub(1).max(1);
    let mut perf = Command::new("perf")
        .args(["record", "-q", "-a", "-g", "-F", "20000", "-o", &data, "--"])
        .args(["sleep", &record_s.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting perf record")?;
    let wrk = thread::scope(|s| s.spawn(|| lab::wrk(load)).join());
    let perf_ok = perf.wait()?.success();
    let (_, _, wrk) = wrk.map_err(|_| anyhow::anyhow!("wrk thread panicked"))??;
    ensure!(perf_ok, "perf record failed");
    // Line info is read while the programs are still loaded.
    let mut progs = Vec::new();
    for (id, name, runs, ns) in programs()? {
        if before.contains(&id) || runs == 0 {
            continue;
        }
        let lines = prog_lines(id)?;
        let xlated = process::capture(Command::new("bpftool").args([
            "prog",
            "dump",
            "xlated",
            "id",
            &id.to_string(),
            "linum",
        ]))?;
        progs.push((name, runs, ns, lines, parse_xlated(&xlated)));
    }
    tracer.end()?;
    let chains = parse_chains(&process::capture(
        Command::new("perf").args(["script", "-i", &data, "-F", "ip"]),
    )?);
    let _ = fs::remove_file(&data);
    progs.sort_by_key(|p| std::cmp::Reverse(p.2));
    let mut md = format!(
        "# Where stackprobe's programs spend their time, by source line\n\n\
         `stackprobe watch nginx php-fpm postgres` on the lab's {:?} page, wrk with {} \
         connections for {} s ({} requests); perf sampling every CPU at 20 kHz. Program \
         run counts and times are since attach. A sample \
         lands on the instruction waiting for a load, so a cold line shows on the code that \
         first reads it; time in kernel functions a program calls (a hash lookup, a helper's \
         copy) goes to the line that called it, through the sample's callchain.\n",
        load.page, load.connections, load.seconds, wrk.requests
    );
    for (name, runs, ns, lines, source) in &progs {
        let (rows, total) = attribute(&chains, lines, source);
        let _ = writeln!(
            md,
            "\n## {name}: {runs} runs, {:.0} ns/run, {total} samples\n\n\
             | samples | share | in its code | in functions it called | source line |\n\
             |---:|---:|---:|---:|---|",
            *ns as f64 / (*runs).max(1) as f64
        );
        for r in rows.iter().take(top) {
            let n = r.own + r.called;
            let _ = writeln!(
                md,
                "| {n} | {:.1} % | {} | {} | {} |",
                100.0 * n as f64 / total.max(1) as f64,
                r.own,
                r.called,
                r.line.replace('|', "\\|")
            );
        }
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    const XLATED: &str = "\
int tcp_state_btf(void * ctx):
; #[btf_tracepoint(function = \"inet_sock_set_state\")] [file:/w/probes-ebpf/src/tcp_state.rs line_num:118 line_col:0]
   0: (bf) r8 = r1
; if (*s).sk == sk { [file:/w/probes-ebpf/src/tracked.rs line_num:105 line_col:16]
   1: (79) r9 = *(u64 *)(r8 +16)
   2: (79) r6 = *(u64 *)(r8 +8)
; self.count += 1; [file:/w/probes-common/src/hist.rs line_num:207 line_col:9]
   3: (07) r2 += -104
; fun(map, key) [file:/root/.cargo/registry/src/index.crates.io-1/aya-ebpf-bindings-0.2.0/src/x86_64/helpers.rs line_num:10 line_col:5]
   4: (85) call bpf_map_lookup_elem#1
";

    #[test]
    fn xlated_instructions_take_the_source_line_before_them() {
        let s = parse_xlated(XLATED);
        assert_eq!(s.len(), 5);
        assert!(s[&0].starts_with("tcp_state.rs:118 "));
        assert_eq!(s[&4], "hist.rs:207 `self.count += 1;` via helpers.rs:10");
        assert_eq!(s[&1], "tracked.rs:105 `if (*s).sk == sk {`");
        assert_eq!(s[&2], s[&1]);
        assert_eq!(s[&3], "hist.rs:207 `self.count += 1;`");
    }

    #[test]
    fn samples_go_to_the_line_of_the_code_they_land_in_or_called_from() {
        let source = parse_xlated(XLATED);
        let prog = ProgLines {
            // Two functions: the main one and a subprogram.
            functions: vec![(0x1000, 0x40), (0x2000, 0x10)],
            lines: vec![(0x1000, 0), (0x1010, 1), (0x1030, 3), (0x2000, 2)],
        };
        // A hash lookup in the kernel, called from instruction 3.
        let lookup = 0xffff_0000_u64;
        let chains = parse_chains(&format!(
            "\t1005\n\tf00\n\n\t1012\n\n\t1012\n\n\t2004\n\t1011\n\n\
             \t{lookup:x}\n\t1031\n\tf00\n\n\t1040\n\n\t{lookup:x}\n\tfff\n"
        ));
        assert_eq!(chains.values().sum::<u64>(), 7);
        let (rows, total) = attribute(&chains, &prog, &source);
        // Not the program's: 0x1040 (past its first function), and the
        // lookup called from elsewhere.
        assert_eq!(total, 5);
        let tracked = "tracked.rs:105 `if (*s).sk == sk {`";
        assert_eq!(
            rows,
            [
                // Instructions 1 (twice) and 2 (the subprogram).
                LineSamples {
                    line: tracked.into(),
                    own: 3,
                    called: 0
                },
                LineSamples {
                    line: "hist.rs:207 `self.count += 1;`".into(),
                    own: 0,
                    called: 1
                },
                LineSamples {
                    line: source[&0].clone(),
                    own: 1,
                    called: 0
                },
            ]
        );
    }
}
