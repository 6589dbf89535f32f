//! The detail of one role: its percentiles, the chain of roles it is on,
//! its accept latency's bars, its history and its links.

use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    widgets::{Block, Borders, Paragraph, Row, Sparkline, Table},
};

use stackprobe_model::{
    histogram::{Summary, duration},
    measure::{Count, Latency, Per},
    report::RoleRow,
};

use super::{
    path,
    state::{Dashboard, RoleLine, Sample},
};
use crate::view::{text::log2_bars, time_wait_age};

pub(super) fn render_detail(frame: &mut Frame, area: Rect, d: &Dashboard, line: &RoleLine<'_>) {
    let r = line.role;
    let rows = latency_rows(r);
    let chain = path::chain_of(d, r);
    let [table_area, path_area, bars_area, spark_area, links_area] = Layout::vertical([
        Constraint::Length(rows.len() as u16 + 2),
        Constraint::Length(chain.map_or(0, path::height)),
        Constraint::Min(3),
        Constraint::Length(3),
        Constraint::Length(4),
    ])
    .areas(area);
    frame.render_widget(percentile_table(title(r), &rows), table_area);
    if let Some(c) = chain {
        path::render_path(frame, path_area, d, c);
    }
    render_bars(frame, bars_area, r);
    render_history(frame, spark_area, d, r);
    render_links(frame, links_area, d, r);
}

/// The table's rows, each a name and its latencies: accepts, and every
/// other declared latency but connects that has had a sample since the
/// start (one never measured, run-queue wait without `--run-queue` say,
/// would only take a line of 24); then, for a role accepting from more than
/// one listener, each one's accepts and its other latencies kept per
/// listener; then its connects, per destination.
fn latency_rows(r: &RoleRow) -> Vec<(String, &Summary)> {
    let mut rows: Vec<(String, &Summary)> = r
        .latency
        .iter()
        .filter(|(l, m)| l.decl().per != Per::Destination && (*l == Latency::Accept || m.total > 0))
        .map(|(l, m)| (l.decl().short.to_string(), &m.latency))
        .collect();
    if r.listeners.len() > 1 {
        for l in &r.listeners {
            for (latency, m) in l.latency.iter() {
                let label = if latency == Latency::Accept {
                    match l.lost.filter(|c| c.total > 0) {
                        Some(c) => {
                            format!("from {} ({} lost at a full queue)", l.listener, c.count)
                        }
                        None => format!("from {}", l.listener),
                    }
                } else if m.total > 0 {
                    format!("  {}", latency.decl().short)
                } else {
                    continue;
                };
                rows.push((label, &m.latency));
            }
        }
    }
    for c in &r.connects {
        let failures = c.refused.total + c.failed.total + c.lost.total;
        let label = if failures > 0 {
            format!(
                "connect {} ({} refused, {} failed, {} lost at a full queue)",
                c.destination, c.refused.total, c.failed.total, c.lost.total
            )
        } else {
            format!("connect {}", c.destination)
        };
        rows.push((label, &c.connects().latency));
        for (l, m) in c.latency.iter() {
            if l != Latency::Connect && m.total > 0 {
                rows.push((format!("  {}", l.decl().short), &m.latency));
            }
        }
    }
    rows
}

/// The role, its processes, forks per accept, children and pids.
fn title(r: &RoleRow) -> String {
    let pids: Vec<String> = r.pids.iter().map(u32::to_string).collect();
    let more = if r.processes > r.pids.len() {
        " …"
    } else {
        ""
    };
    // Accepts of threads blocked in accept() at attach have no latency:
    // said beside the percentiles, which do not include them.
    let untimed = if r.counts[Count::AcceptUntimed].total > 0 {
        format!(
            " · accepts of unknown latency {}",
            r.counts[Count::AcceptUntimed].total
        )
    } else {
        String::new()
    };
    // How many connections its server held, against what it may.
    let busy = r.busy.as_ref().map_or_else(String::new, |b| {
        let of = b.limit.as_ref().map_or_else(
            || format!("{} processes", b.processes),
            |l| format!("{} {}", l.setting, l.value),
        );
        format!(" · busy {:.1} (max {} of {of})", b.mean, b.max)
    });
    format!(
        " {} · {} process{} · forks/accept {} · children alive {}{untimed}{busy} · pids {}{more} ",
        r.role,
        r.processes,
        if r.processes == 1 { "" } else { "es" },
        r.forks_per_accept.map_or("-".into(), |x| format!("{x:.2}")),
        r.children_alive,
        if pids.is_empty() {
            "-".to_string()
        } else {
            pids.join(" ")
        },
    )
}

fn percentile_table(title: String, rows: &[(String, &Summary)]) -> Table<'static> {
    let name_width = rows
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(12)
        .clamp(12, 40);
    Table::new(
        rows.iter().map(|(name, s)| percentile_row(name, s)),
        [
            Constraint::Length(name_width as u16),
            Constraint::Length(7),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(9),
        ],
    )
    .header(
        Row::new(vec!["", "count", "p50", "p90", "p99", "p99.9", "max"])
            .style(Style::default().add_modifier(Modifier::BOLD)),
    )
    .block(Block::default().borders(Borders::TOP).title(title))
}

fn percentile_row(name: &str, s: &Summary) -> Row<'static> {
    let cells = if s.count == 0 {
        vec![
            name.to_string(),
            "0".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
        ]
    } else {
        vec![
            name.to_string(),
            s.count.to_string(),
            duration(s.p50_ns),
            duration(s.p90_ns),
            duration(s.p99_ns),
            duration(s.p999_ns),
            duration(s.max_ns),
        ]
    };
    Row::new(cells)
}

/// The accept latency's power-of-two buckets, as bars.
fn render_bars(frame: &mut Frame, area: Rect, r: &RoleRow) {
    let bars = log2_bars(&r.latency[Latency::Accept].log2_buckets);
    let bars = if bars.is_empty() {
        "no accepts in this interval".to_string()
    } else {
        bars
    };
    frame.render_widget(
        Paragraph::new(bars).block(
            Block::default()
                .borders(Borders::TOP)
                .title(" accept latency (ns) "),
        ),
        area,
    );
}

/// Accepts per second and their p99 over the last intervals, side by side.
fn render_history(frame: &mut Frame, area: Rect, d: &Dashboard, r: &RoleRow) {
    let history: Vec<Sample> = d
        .history
        .get(&r.role)
        .map(|h| h.iter().copied().collect())
        .unwrap_or_default();
    let rates: Vec<u64> = history.iter().map(|s| s.accepts_per_s).collect();
    let p99s: Vec<u64> = history.iter().map(|s| s.accept_p99_us).collect();
    let [rate_area, p99_area] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let sparkline = |data: &[u64], color: Color, title: String| {
        Sparkline::default()
            .data(data)
            .style(d.style(color))
            .block(Block::default().borders(Borders::TOP).title(title))
    };
    frame.render_widget(
        sparkline(
            &rates,
            Color::Cyan,
            format!(" accepts/s, last {} intervals ", rates.len()),
        ),
        rate_area,
    );
    frame.render_widget(
        sparkline(&p99s, Color::Magenta, " accept p99 (µs) ".into()),
        p99_area,
    );
}

/// The role's listeners that lost connections at a full queue, then the
/// links the role owns, and how old their TIME_WAIT counts are.
fn render_links(frame: &mut Frame, area: Rect, d: &Dashboard, r: &RoleRow) {
    let lost = r.listeners.iter().filter_map(|l| {
        let lost = l.lost.filter(|c| c.total > 0)?;
        let backlog = match (l.backlog, l.max_backlog) {
            (Some(n), Some(max)) => format!("  backlog {n}/{max}"),
            _ => String::new(),
        };
        Some(format!(
            "listener {}{backlog}  lost at a full queue {} ({} in all)",
            l.listener, lost.count, lost.total
        ))
    });
    let links: Vec<String> = lost
        .chain(
            d.report
                .iter()
                .flat_map(|rep| &rep.tcp.links)
                .filter(|l| l.owner.as_deref() == Some(&r.role))
                .map(|l| {
                    format!(
                        "{}  TIME_WAIT {} (+{:.0}/s)  opens {}  closes {}  aborts {}",
                        l.link,
                        l.time_wait,
                        l.new_time_wait_per_s,
                        l.opens.count,
                        l.closes.count,
                        l.aborts.count
                    )
                }),
        )
        .collect();
    let links = if links.is_empty() {
        "no connections seen".to_string()
    } else {
        links.join("\n")
    };
    let title = match d.report.as_ref().and_then(|rep| time_wait_age(&rep.tcp)) {
        Some(age) => format!(" links: {age} "),
        None => " links ".to_string(),
    };
    frame.render_widget(
        Paragraph::new(links).block(Block::default().borders(Borders::TOP).title(title)),
        area,
    );
}
