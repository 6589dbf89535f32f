//! The overview: one row per role (and per pid of an expanded role), and
//! the status bar above every screen.

use ratatui::{
    Frame,
    layout::{Constraint, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState},
};

use stackprobe_model::{containers, measure::Latency, report::RoleRow};

use super::{
    help::hooks_line,
    state::{Dashboard, RoleLine, SortColumn},
};

/// A latency in at most 5 characters (`2.2µs`, `412µs`, `12ms`), or `-`
/// when nothing was measured.
pub(super) fn ns(v: u64, count: u64) -> String {
    if count == 0 {
        return "-".into();
    }
    let (value, unit) = match v {
        0..1_000 => return format!("{v}ns"),
        1_000..1_000_000 => (v as f64 / 1e3, "µs"),
        1_000_000..1_000_000_000 => (v as f64 / 1e6, "ms"),
        _ => (v as f64 / 1e9, "s"),
    };
    if value < 10.0 {
        format!("{value:.1}{unit}")
    } else {
        format!("{value:.0}{unit}")
    }
}

pub(super) fn render_status(frame: &mut Frame, area: Rect, d: &Dashboard) {
    let s = &d.status;
    let cost = match s.ns_per_event {
        Some(ns) => format!("{ns:.0}ns/run"),
        None => "cost: --probe-cost".into(),
    };
    let paused = d.style(Color::Yellow).add_modifier(Modifier::BOLD);
    let mut spans = Vec::new();
    if d.paused {
        spans.push(Span::styled("PAUSED ", paused));
    }
    spans.push(Span::raw(format!(
        "stackprobe +{:.0}s every {:.1}s {:.0} ev/s ",
        s.elapsed_s, s.interval_s, s.events_per_s
    )));
    spans.push(match s.drops {
        0 => Span::raw("drops 0"),
        // Every drop is missing from the numbers shown.
        drops => Span::styled(
            format!("drops {drops}"),
            d.style(Color::Red).add_modifier(Modifier::BOLD),
        ),
    });
    spans.push(Span::raw(format!("  {cost}  cpu {:.1}%", s.cpu_percent)));
    // The hooks this kernel gave: visible on wider terminals, and in the help.
    if let Some(r) = d.report.as_ref().filter(|r| !r.rungs.is_empty()) {
        spans.push(Span::raw(format!("  {}", hooks_line(r))));
    }
    if d.paused {
        spans.push(Span::styled("  PAUSED", paused));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// The overview's columns: a container column only when some role runs in
/// one (the role column then shows the role without its container), and
/// the run-queue wait's p99 only when the run-queue probe measured some
/// role (`--run-queue`), so that 80 columns keep the role's name without.
struct Columns {
    in_containers: bool,
    run_queue: bool,
}

impl Columns {
    /// `cell` in the container column, when there is one.
    fn container(&self, cell: String) -> Vec<String> {
        if self.in_containers {
            vec![cell]
        } else {
            Vec::new()
        }
    }

    /// The header; p50/p99 columns belong to the rate column on their left.
    fn header(&self, d: &Dashboard) -> Row<'static> {
        let sort_mark = |col: SortColumn, name: &str| {
            if d.sort == col {
                format!("{name}{}", if d.reverse { "▲" } else { "▼" })
            } else {
                name.to_string()
            }
        };
        let mut header = vec![sort_mark(SortColumn::Role, "ROLE")];
        header.extend(self.container("CONTAINER".into()));
        header.extend([
            "PROC".into(),
            sort_mark(SortColumn::Accepts, "ACC/s"),
            "p50".into(),
            sort_mark(SortColumn::AcceptP99, "p99"),
            sort_mark(SortColumn::Forks, "FRK/s"),
            "p50".into(),
            sort_mark(SortColumn::ForkP99, "p99"),
            "ALIVE".into(),
            sort_mark(SortColumn::TimeWait, "TW"),
            "TW+/s".into(),
        ]);
        if self.run_queue {
            header.push("RQp99".into());
        }
        Row::new(header).style(Style::default().add_modifier(Modifier::BOLD))
    }

    fn widths(&self) -> Vec<Constraint> {
        let mut widths = vec![Constraint::Min(12)];
        if self.in_containers {
            widths.push(Constraint::Length(12));
        }
        widths.extend([
            Constraint::Length(4),
            Constraint::Length(6),
            Constraint::Length(5),
            Constraint::Length(5),
            Constraint::Length(6),
            Constraint::Length(5),
            Constraint::Length(5),
            Constraint::Length(5),
            Constraint::Length(5),
            Constraint::Length(5),
        ]);
        if self.run_queue {
            widths.push(Constraint::Length(5));
        }
        widths
    }

    /// A role's row: its processes, accepts, forks and TIME_WAIT, coloured
    /// past their thresholds.
    fn role_row(&self, d: &Dashboard, l: &RoleLine<'_>) -> Row<'static> {
        let r = l.role;
        let accept = &r.latency[Latency::Accept];
        let fork = &r.latency[Latency::Fork];
        let mut cells = if self.in_containers {
            vec![
                Cell::from(containers::bare_role(&r.role).to_string()),
                Cell::from(r.container.clone().unwrap_or_default()),
            ]
        } else {
            vec![Cell::from(r.role.clone())]
        };
        cells.extend([
            Cell::from(r.processes.to_string()),
            Cell::from(format!("{:.0}", accept.rate_per_s)),
            Cell::from(ns(accept.latency.p50_ns, accept.latency.count)),
            Cell::from(ns(accept.latency.p99_ns, accept.latency.count)).style(d.level(
                accept.latency.p99_ns as f64,
                10e6,
                100e6,
            )),
            Cell::from(format!("{:.0}", fork.rate_per_s)).style(d.level(
                fork.rate_per_s,
                100.0,
                1000.0,
            )),
            Cell::from(ns(fork.latency.p50_ns, fork.latency.count)),
            Cell::from(ns(fork.latency.p99_ns, fork.latency.count)),
            Cell::from(r.children_alive.to_string()),
            Cell::from(l.time_wait.to_string()),
            Cell::from(format!("{:.0}", l.time_wait_per_s)).style(d.level(
                l.time_wait_per_s,
                100.0,
                1000.0,
            )),
        ]);
        if self.run_queue {
            // A millisecond is a scheduler slice spent behind another
            // thread (the insight's floor for the mean); ten, several.
            let waits = &r.latency[Latency::RunQueue].latency;
            cells.push(Cell::from(ns(waits.p99_ns, waits.count)).style(d.level(
                waits.p99_ns as f64,
                1e6,
                10e6,
            )));
        }
        Row::new(cells)
    }

    /// An expanded role's rows: one per pid, with its own accept numbers
    /// when it accepted anything, and how many more it has than shown.
    fn pid_rows(&self, d: &Dashboard, r: &RoleRow) -> Vec<Row<'static>> {
        let processes = d
            .report
            .as_ref()
            .map(|rep| rep.processes.as_slice())
            .unwrap_or_default();
        let mut rows = Vec::new();
        for pid in &r.pids {
            let p = processes.iter().find(|p| p.pid == *pid);
            let (rate, p50, p99) = p.map_or(("-".into(), "-".into(), "-".into()), |p| {
                (
                    format!("{:.0}", p.rate_per_s),
                    ns(p.latency.p50_ns, p.latency.count),
                    ns(p.latency.p99_ns, p.latency.count),
                )
            });
            let inside = p
                .and_then(|p| p.ns_pid)
                .map_or_else(String::new, |n| format!(" ({n} inside)"));
            let mut cells = vec![format!("  pid {pid}{inside}")];
            cells.extend(self.container(String::new()));
            cells.extend([String::new(), rate, p50, p99]);
            rows.push(Row::new(cells).style(d.style(Color::DarkGray)));
        }
        if r.processes > r.pids.len() {
            rows.push(Row::new(vec![format!(
                "  … {} more",
                r.processes - r.pids.len()
            )]));
        }
        rows
    }
}

pub(super) fn render_overview(
    frame: &mut Frame,
    area: Rect,
    d: &Dashboard,
    lines: &[RoleLine<'_>],
    selected: usize,
) {
    let columns = Columns {
        in_containers: lines.iter().any(|l| l.role.container.is_some()),
        run_queue: lines
            .iter()
            .any(|l| l.role.latency[Latency::RunQueue].total > 0),
    };
    let mut rows: Vec<Row<'_>> = Vec::new();
    let mut selected_row = 0;
    for (i, l) in lines.iter().enumerate() {
        if i == selected {
            selected_row = rows.len();
        }
        rows.push(columns.role_row(d, l));
        if d.expanded.contains(&l.role.role) {
            rows.extend(columns.pid_rows(d, l.role));
        }
    }
    let title = match (lines.is_empty(), &d.report) {
        (false, _) => " roles ",
        (true, None) => "collecting…",
        (true, Some(_)) => "no watched process yet",
    };
    let table = Table::new(rows, columns.widths())
        .header(columns.header(d))
        .column_spacing(1)
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
        .block(Block::default().borders(Borders::TOP).title(title));
    let mut state = TableState::default().with_selected(Some(selected_row));
    frame.render_stateful_widget(table, area, &mut state);
}
