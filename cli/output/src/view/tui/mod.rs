//! The live dashboard: an overview of roles, a detail view of one, insights
//! and a status bar. Rendering only: it draws the reports the model builds.

pub mod terminal;

use std::collections::{BTreeMap, VecDeque};

use ratatui::{
    Frame,
    crossterm::event::{KeyCode, KeyEvent, KeyModifiers},
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Sparkline, Table, TableState, Wrap},
};

use stackprobe_model::measure::{Count, Latency, Per};
use stackprobe_model::{
    containers,
    histogram::{Summary, duration},
    report::{Report, RoleRow},
};

/// Interval samples kept per role for the time series.
pub const HISTORY: usize = 120;

/// One interval of a role's time series.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    accepts_per_s: u64,
    accept_p99_us: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortColumn {
    Role,
    Accepts,
    AcceptP99,
    Forks,
    ForkP99,
    TimeWait,
}

const SORTS: [SortColumn; 6] = [
    SortColumn::Accepts,
    SortColumn::AcceptP99,
    SortColumn::Forks,
    SortColumn::ForkP99,
    SortColumn::TimeWait,
    SortColumn::Role,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Screen {
    Overview,
    Detail,
}

/// What a key asks the caller to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    /// Empty the histograms and counters and start again.
    Reset,
}

/// Stackprobe's own numbers for the status bar.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Status {
    pub elapsed_s: f64,
    pub interval_s: f64,
    pub events_per_s: f64,
    pub drops: u64,
    /// ns per BPF program run over the interval, when measured (--probe-cost).
    pub ns_per_event: Option<f64>,
    pub cpu_percent: f64,
}

/// One role's row in the overview, with its links' TIME_WAIT summed.
struct RoleLine<'a> {
    role: &'a RoleRow,
    time_wait: u64,
    time_wait_per_s: f64,
}

pub struct Dashboard {
    report: Option<Report>,
    history: BTreeMap<String, VecDeque<Sample>>,
    pub status: Status,
    selected: usize,
    sort: SortColumn,
    reverse: bool,
    screen: Screen,
    paused: bool,
    help: bool,
    filter: String,
    filtering: bool,
    color: bool,
    /// Roles shown with one line per pid.
    expanded: std::collections::BTreeSet<String>,
}

impl Dashboard {
    pub fn new(color: bool) -> Self {
        Self {
            report: None,
            history: BTreeMap::new(),
            status: Status::default(),
            selected: 0,
            sort: SortColumn::Accepts,
            reverse: false,
            screen: Screen::Overview,
            paused: false,
            help: false,
            filter: String::new(),
            filtering: false,
            color,
            expanded: std::collections::BTreeSet::new(),
        }
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// A new interval report (ignored while paused: the view freezes,
    /// collection goes on).
    pub fn update(&mut self, report: Report, status: Status) {
        if self.paused {
            return;
        }
        for role in &report.roles {
            let h = self.history.entry(role.role.clone()).or_default();
            h.push_back(Sample {
                accepts_per_s: role.latency[Latency::Accept].rate_per_s.round() as u64,
                accept_p99_us: role.latency[Latency::Accept].latency.p99_ns / 1000,
            });
            while h.len() > HISTORY {
                h.pop_front();
            }
        }
        self.report = Some(report);
        self.status = status;
    }

    pub fn key(&mut self, key: KeyEvent) -> Action {
        if key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL) {
            return Action::Quit;
        }
        if self.filtering {
            match key.code {
                KeyCode::Enter | KeyCode::Esc => self.filtering = false,
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) => self.filter.push(c),
                _ => {}
            }
            self.selected = 0;
            return Action::None;
        }
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Char('p') => self.paused = !self.paused,
            KeyCode::Char('r') => {
                self.history.clear();
                return Action::Reset;
            }
            KeyCode::Char('s') => {
                let i = SORTS.iter().position(|&s| s == self.sort).unwrap_or(0);
                self.sort = SORTS[(i + 1) % SORTS.len()];
            }
            KeyCode::Char('S') => self.reverse = !self.reverse,
            KeyCode::Char('/') => {
                self.filtering = true;
                self.filter.clear();
            }
            KeyCode::Char('?') => self.help = !self.help,
            KeyCode::Char('x') | KeyCode::Right | KeyCode::Left => {
                if let Some(role) = self.selected_role()
                    && !self.expanded.remove(&role)
                {
                    self.expanded.insert(role);
                }
            }
            KeyCode::Enter => self.screen = Screen::Detail,
            KeyCode::Esc => {
                self.help = false;
                self.screen = Screen::Overview;
            }
            KeyCode::Tab => {
                self.screen = match self.screen {
                    Screen::Overview => Screen::Detail,
                    Screen::Detail => Screen::Overview,
                }
            }
            KeyCode::Down | KeyCode::Char('j') => self.selected = self.selected.saturating_add(1),
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            _ => {}
        }
        Action::None
    }

    fn selected_role(&self) -> Option<String> {
        let lines = self.lines();
        let i = self.selected.min(lines.len().checked_sub(1)?);
        Some(lines[i].role.role.clone())
    }

    fn lines(&self) -> Vec<RoleLine<'_>> {
        let Some(report) = &self.report else {
            return Vec::new();
        };
        let mut lines: Vec<RoleLine<'_>> = report
            .roles
            .iter()
            .filter(|r| self.filter.is_empty() || r.role.contains(&self.filter))
            .map(|role| {
                let links = report
                    .tcp
                    .links
                    .iter()
                    .filter(|l| l.owner.as_deref() == Some(&role.role));
                let (time_wait, time_wait_per_s) = links.fold((0, 0.0), |(n, r), l| {
                    (n + l.time_wait, r + l.new_time_wait_per_s)
                });
                RoleLine {
                    role,
                    time_wait,
                    time_wait_per_s,
                }
            })
            .collect();
        let key = |l: &RoleLine<'_>| -> f64 {
            match self.sort {
                SortColumn::Role => 0.0,
                SortColumn::Accepts => l.role.latency[Latency::Accept].rate_per_s,
                SortColumn::AcceptP99 => l.role.latency[Latency::Accept].latency.p99_ns as f64,
                SortColumn::Forks => l.role.latency[Latency::Fork].rate_per_s,
                SortColumn::ForkP99 => l.role.latency[Latency::Fork].latency.p99_ns as f64,
                SortColumn::TimeWait => l.time_wait as f64,
            }
        };
        lines.sort_by(|a, b| {
            let by = if self.sort == SortColumn::Role {
                a.role.role.cmp(&b.role.role)
            } else {
                key(b)
                    .total_cmp(&key(a))
                    .then(a.role.role.cmp(&b.role.role))
            };
            if self.reverse { by.reverse() } else { by }
        });
        lines
    }

    fn style(&self, color: Color) -> Style {
        if self.color {
            Style::default().fg(color)
        } else {
            Style::default()
        }
    }

    /// Green, yellow or red by thresholds (plain without colour).
    fn level(&self, value: f64, warn: f64, bad: f64) -> Style {
        if value >= bad {
            self.style(Color::Red)
        } else if value >= warn {
            self.style(Color::Yellow)
        } else {
            Style::default()
        }
    }
}

/// A latency in at most 5 characters (`2.2µs`, `412µs`, `12ms`), or `-`
/// when nothing was measured.
fn ns(v: u64, count: u64) -> String {
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

pub fn render(frame: &mut Frame, d: &Dashboard) {
    let [status, main, insights_area, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(6),
        Constraint::Length(4),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    render_status(frame, status, d);
    let lines = d.lines();
    let selected = d.selected.min(lines.len().saturating_sub(1));
    match (d.screen, lines.get(selected)) {
        (Screen::Detail, Some(line)) => render_detail(frame, main, d, line),
        _ => render_overview(frame, main, d, &lines, selected),
    }
    render_insights(frame, insights_area, d);
    let hint = if d.filtering {
        format!("filter: {}_  (Enter/Esc to finish)", d.filter)
    } else {
        "q quit  p pause  r reset  s/S sort  / filter  x pids  Enter/Esc detail  ? help".to_string()
    };
    frame.render_widget(Paragraph::new(hint).style(d.style(Color::DarkGray)), footer);
    if d.help {
        render_help(frame, main, d.report.as_ref());
    }
}

fn render_status(frame: &mut Frame, area: Rect, d: &Dashboard) {
    let s = &d.status;
    let cost = match s.ns_per_event {
        Some(ns) => format!("{ns:.0}ns/run"),
        None => "cost: --probe-cost".into(),
    };
    let mut spans = Vec::new();
    if d.paused {
        spans.push(Span::styled(
            "PAUSED ",
            d.style(Color::Yellow).add_modifier(Modifier::BOLD),
        ));
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
        spans.push(Span::styled(
            "  PAUSED",
            d.style(Color::Yellow).add_modifier(Modifier::BOLD),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn render_overview(
    frame: &mut Frame,
    area: Rect,
    d: &Dashboard,
    lines: &[RoleLine<'_>],
    selected: usize,
) {
    let sort_mark = |col: SortColumn, name: &str| {
        if d.sort == col {
            format!("{name}{}", if d.reverse { "▲" } else { "▼" })
        } else {
            name.to_string()
        }
    };
    // A container column only when some role runs in one; the role column
    // then shows the role without its container.
    let in_containers = lines.iter().any(|l| l.role.container.is_some());
    let container_cells = |cell: String| -> Vec<String> {
        if in_containers {
            vec![cell]
        } else {
            Vec::new()
        }
    };
    // p50/p99 columns belong to the rate column on their left.
    let mut header = vec![sort_mark(SortColumn::Role, "ROLE")];
    header.extend(container_cells("CONTAINER".into()));
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
    let header = Row::new(header).style(Style::default().add_modifier(Modifier::BOLD));
    let mut rows: Vec<Row<'_>> = Vec::new();
    let mut selected_row = 0;
    for (i, l) in lines.iter().enumerate() {
        if i == selected {
            selected_row = rows.len();
        }
        let r = l.role;
        let mut cells = if in_containers {
            vec![
                Cell::from(containers::bare_role(&r.role).to_string()),
                Cell::from(r.container.clone().unwrap_or_default()),
            ]
        } else {
            vec![Cell::from(r.role.clone())]
        };
        cells.extend([
            Cell::from(r.processes.to_string()),
            Cell::from(format!("{:.0}", r.latency[Latency::Accept].rate_per_s)),
            Cell::from(ns(
                r.latency[Latency::Accept].latency.p50_ns,
                r.latency[Latency::Accept].latency.count,
            )),
            Cell::from(ns(
                r.latency[Latency::Accept].latency.p99_ns,
                r.latency[Latency::Accept].latency.count,
            ))
            .style(d.level(
                r.latency[Latency::Accept].latency.p99_ns as f64,
                10e6,
                100e6,
            )),
            Cell::from(format!("{:.0}", r.latency[Latency::Fork].rate_per_s)).style(d.level(
                r.latency[Latency::Fork].rate_per_s,
                100.0,
                1000.0,
            )),
            Cell::from(ns(
                r.latency[Latency::Fork].latency.p50_ns,
                r.latency[Latency::Fork].latency.count,
            )),
            Cell::from(ns(
                r.latency[Latency::Fork].latency.p99_ns,
                r.latency[Latency::Fork].latency.count,
            )),
            Cell::from(r.children_alive.to_string()),
            Cell::from(l.time_wait.to_string()),
            Cell::from(format!("{:.0}", l.time_wait_per_s)).style(d.level(
                l.time_wait_per_s,
                100.0,
                1000.0,
            )),
        ]);
        rows.push(Row::new(cells));
        // Expanded: one line per pid, with its own accept numbers when it
        // accepted anything.
        if d.expanded.contains(&r.role) {
            let processes = d
                .report
                .as_ref()
                .map(|rep| rep.processes.as_slice())
                .unwrap_or_default();
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
                cells.extend(container_cells(String::new()));
                cells.extend([String::new(), rate, p50, p99]);
                rows.push(Row::new(cells).style(d.style(Color::DarkGray)));
            }
            if r.processes > r.pids.len() {
                rows.push(Row::new(vec![format!(
                    "  … {} more",
                    r.processes - r.pids.len()
                )]));
            }
        }
    }
    let mut widths = vec![Constraint::Min(12)];
    if in_containers {
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
    let empty = if d.report.is_none() {
        "collecting…"
    } else {
        "no watched process yet"
    };
    let table = Table::new(rows, widths)
        .header(header)
        .column_spacing(1)
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
        .block(
            Block::default()
                .borders(Borders::TOP)
                .title(if lines.is_empty() { empty } else { " roles " }),
        );
    let mut state = TableState::default().with_selected(Some(selected_row));
    frame.render_stateful_widget(table, area, &mut state);
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

fn render_detail(frame: &mut Frame, area: Rect, d: &Dashboard, line: &RoleLine<'_>) {
    let r = line.role;
    // Every declared latency but connects (per destination, below).
    let mut rows: Vec<(String, &Summary)> = r
        .latency
        .iter()
        .filter(|(l, _)| l.decl().per != Per::Destination)
        .map(|(l, m)| (l.decl().short.to_string(), &m.latency))
        .collect();
    // A role accepting from more than one listener: each one's accepts and
    // its other latencies kept per listener, under the role's.
    if r.listeners.len() > 1 {
        for l in &r.listeners {
            for (latency, m) in l.latency.iter() {
                let label = if latency == Latency::Accept {
                    format!("from {}", l.listener)
                } else if m.total > 0 {
                    format!("  {}", latency.decl().short)
                } else {
                    continue;
                };
                rows.push((label, &m.latency));
            }
        }
    }
    // Its connects, per destination.
    for c in &r.connects {
        let failures = c.refused.total + c.failed.total;
        let label = if failures > 0 {
            format!(
                "connect {} ({} refused, {} failed)",
                c.destination, c.refused.total, c.failed.total
            )
        } else {
            format!("connect {}", c.destination)
        };
        rows.push((label, &c.latency.latency));
    }
    let name_width = rows
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(12)
        .clamp(12, 40);
    let [table_area, bars_area, spark_area, links_area] = Layout::vertical([
        Constraint::Length(rows.len() as u16 + 2),
        Constraint::Min(3),
        Constraint::Length(3),
        Constraint::Length(4),
    ])
    .areas(area);
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
    let title = format!(
        " {} · {} process{} · forks/accept {} · children alive {}{untimed} · pids {}{more} ",
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
    );
    let table = Table::new(
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
    .block(Block::default().borders(Borders::TOP).title(title));
    frame.render_widget(table, table_area);

    let bars = crate::view::text::log2_bars(&r.latency[Latency::Accept].log2_buckets);
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
        bars_area,
    );
    let history: Vec<Sample> = d
        .history
        .get(&r.role)
        .map(|h| h.iter().copied().collect())
        .unwrap_or_default();
    let rates: Vec<u64> = history.iter().map(|s| s.accepts_per_s).collect();
    let p99s: Vec<u64> = history.iter().map(|s| s.accept_p99_us).collect();
    let [rate_area, p99_area] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)])
            .areas(spark_area);
    frame.render_widget(
        Sparkline::default()
            .data(&rates)
            .style(d.style(Color::Cyan))
            .block(
                Block::default()
                    .borders(Borders::TOP)
                    .title(format!(" accepts/s, last {} intervals ", rates.len())),
            ),
        rate_area,
    );
    frame.render_widget(
        Sparkline::default()
            .data(&p99s)
            .style(d.style(Color::Magenta))
            .block(
                Block::default()
                    .borders(Borders::TOP)
                    .title(" accept p99 (µs) "),
            ),
        p99_area,
    );
    let links: Vec<String> = d
        .report
        .as_ref()
        .map(|rep| {
            rep.tcp
                .links
                .iter()
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
                })
                .collect()
        })
        .unwrap_or_default();
    let links = if links.is_empty() {
        "no connections seen".to_string()
    } else {
        links.join("\n")
    };
    let title = match d
        .report
        .as_ref()
        .and_then(|rep| super::time_wait_age(&rep.tcp))
    {
        Some(age) => format!(" links: {age} "),
        None => " links ".to_string(),
    };
    frame.render_widget(
        Paragraph::new(links).block(Block::default().borders(Borders::TOP).title(title)),
        links_area,
    );
}

fn render_insights(frame: &mut Frame, area: Rect, d: &Dashboard) {
    let (warnings, found) = d
        .report
        .as_ref()
        .map(|r| (r.tcp.warnings.as_slice(), r.insights.as_slice()))
        .unwrap_or_default();
    let text: Vec<Line<'_>> = if found.is_empty() && warnings.is_empty() {
        vec![Line::from("nothing to report yet")]
    } else {
        // Warnings first: what is not counted, or about to fail.
        let warned = warnings.iter().map(|w| (w, Color::Red));
        warned
            .chain(found.iter().map(|i| (i, Color::Yellow)))
            .map(|(i, color)| Line::from(Span::styled(format!("• {i}"), d.style(color))))
            .collect()
    };
    frame.render_widget(
        Paragraph::new(text)
            .wrap(Wrap { trim: true })
            .block(Block::default().borders(Borders::TOP).title(" insights ")),
        area,
    );
}

/// `hooks fork:fentry accept_queue:fexit`.
fn hooks_line(r: &Report) -> String {
    let hooks: Vec<String> = r
        .rungs
        .iter()
        .map(|h| format!("{}:{}", h.metric, h.hook))
        .collect();
    format!("hooks {}", hooks.join(" "))
}

fn render_help(frame: &mut Frame, area: Rect, report: Option<&Report>) {
    let mut help = "q, Ctrl-C   quit\np           pause the view (collection goes on)\nr           reset histograms and counters\ns / S       next sort column / reverse\n/           filter roles by name\n↑ ↓         select a role\nx, ← →      show / hide the role's pids\nEnter, Tab  detail of the selected role\nEsc         back to the overview\n?           this help".to_string();
    if let Some(r) = report.filter(|r| !r.rungs.is_empty()) {
        help.push_str("\n\n");
        help.push_str(&hooks_line(r));
    }
    let w = area.width.min(54);
    let h = area.height.min(14);
    let popup = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(help).block(Block::default().borders(Borders::ALL).title(" keys ")),
        popup,
    );
}

#[cfg(test)]
mod tests {
    use ratatui::{Terminal, backend::TestBackend, crossterm::event::KeyEvent};

    use super::*;
    use stackprobe_model::{
        fixtures::{self, fork_per_connection, live},
        probe_stats::RungInUse,
        process::ProcessTable,
    };

    /// A postmaster that accepted 412 connections in a second and forked a
    /// backend for each (9 ms lives), and an idle nginx.
    fn report() -> Report {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "postgres"), live(2, "nginx")]);
        let latencies: Vec<u64> = (0..412).map(|i| 2_000 + i).collect();
        fork_per_connection(&mut t, 1, "postgres", &latencies, 90_000, 412, 9_000_000);
        fixtures::report(&t).at(5).with_insights().build()
    }

    fn screen(d: &Dashboard, w: u16, h: u16) -> (String, ratatui::buffer::Buffer) {
        let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
        terminal.draw(|f| render(f, d)).unwrap();
        let buf = terminal.backend().buffer().clone();
        let text = (0..h)
            .map(|y| {
                (0..w)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
                    .trim_end()
                    .to_string()
            })
            .collect::<Vec<_>>()
            .join("\n");
        (text, buf)
    }

    fn key(c: char) -> KeyEvent {
        KeyEvent::from(KeyCode::Char(c))
    }

    fn status() -> Status {
        Status {
            elapsed_s: 5.0,
            interval_s: 1.0,
            events_per_s: 1648.0,
            drops: 0,
            ns_per_event: None,
            cpu_percent: 1.5,
        }
    }

    #[test]
    fn overview_fits_80x24_with_roles_rates_and_an_insight() {
        let mut d = Dashboard::new(true);
        d.update(report(), status());
        let (text, _) = screen(&d, 80, 24);
        assert_eq!(
            text.lines().next().unwrap(),
            "stackprobe +5s every 1.0s 1648 ev/s drops 0  cost: --probe-cost  cpu 1.5%"
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines
                .iter()
                .any(|l| l.contains("ROLE") && l.contains("ACC/s▼") && l.contains("TW+/s")),
            "{text}"
        );
        let postmaster = lines
            .iter()
            .find(|l| l.starts_with("postgres postmaster"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(postmaster.contains(" 412 "), "{postmaster}");
        // Sorted by accepts/s: the postmaster first, above the idle nginx.
        let pm = lines
            .iter()
            .position(|l| l.starts_with("postgres postmaster"))
            .unwrap();
        let ng = lines.iter().position(|l| l.starts_with("nginx")).unwrap();
        assert!(pm < ng);
        assert!(
            text.contains("postgres postmaster forks 1.00 processes per accepted"),
            "{text}"
        );
        assert!(lines.last().unwrap().starts_with("q quit"));
    }

    #[test]
    fn nothing_yet_says_so() {
        let d = Dashboard::new(false);
        let (text, _) = screen(&d, 80, 24);
        assert!(text.contains("collecting…"), "{text}");
        assert!(text.contains("nothing to report yet"));
    }

    #[test]
    fn detail_shows_percentiles_bars_and_history() {
        let mut d = Dashboard::new(true);
        d.update(report(), status());
        d.key(KeyEvent::from(KeyCode::Enter));
        let (text, _) = screen(&d, 80, 30);
        assert!(
            text.contains("postgres postmaster · 1 process · forks/accept 1.00"),
            "{text}"
        );
        let accept = text
            .lines()
            .find(|l| l.trim_start().starts_with("accept ") && l.contains("412"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(accept.contains("2.2µs"), "{accept}");
        assert!(text.contains("[2K, 4K)"), "{text}");
        assert!(text.contains("accepts/s, last 1 intervals"));
        assert!(text.contains("child life"));
        d.key(KeyEvent::from(KeyCode::Esc));
        assert!(screen(&d, 80, 24).0.contains("ACC/s"));
    }

    #[test]
    fn the_detail_lists_each_listener_of_a_role_with_two() {
        use stackprobe_model::{event::HistMetric, fixtures::kernel_hist_from};
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "postgres")]);
        for (listener, n, ns) in [
            ("127.0.0.1:5432", 30, 9_000),
            ("/run/postgresql/.s.PGSQL.5432", 12, 4_000),
        ] {
            let samples = vec![ns; n];
            t.apply(&kernel_hist_from(
                1,
                "postgres",
                HistMetric::Accept,
                Some(listener),
                &samples,
            ));
        }
        let mut d = Dashboard::new(false);
        d.update(fixtures::interval_report(&t), status());
        d.key(KeyEvent::from(KeyCode::Enter));
        let (text, _) = screen(&d, 100, 30);
        let row = |name: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(name))
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
                .to_string()
        };
        assert!(row("from 127.0.0.1:5432").contains(" 30 "), "{text}");
        assert!(
            row("from /run/postgresql/.s.PGSQL.5432").contains(" 12 "),
            "{text}"
        );
        assert!(row("accept ").contains(" 42 "), "{text}");
    }

    #[test]
    fn keys_sort_filter_pause_reset_and_quit() {
        let mut d = Dashboard::new(false);
        d.update(report(), status());
        d.key(key('s'));
        let (text, _) = screen(&d, 80, 24);
        assert!(text.contains(" p99▼  FRK/s"), "{text}");
        d.key(key('S'));
        assert!(screen(&d, 80, 24).0.contains(" p99▲  FRK/s"));
        d.key(key('/'));
        for c in "ngi".chars() {
            d.key(key(c));
        }
        d.key(KeyEvent::from(KeyCode::Enter));
        let (text, _) = screen(&d, 80, 24);
        assert!(!text.contains("postgres postmaster  "), "{text}");
        assert!(text.lines().any(|l| l.starts_with("nginx")));
        d.key(key('p'));
        assert!(d.is_paused());
        d.update(
            fixtures::report(&ProcessTable::default()).at(6).build(),
            status(),
        );
        assert!(screen(&d, 80, 24).0.contains("PAUSED"));
        assert!(
            screen(&d, 80, 24).0.lines().any(|l| l.starts_with("nginx")),
            "frozen view keeps the old report"
        );
        assert_eq!(d.key(key('r')), Action::Reset);
        assert_eq!(d.key(key('q')), Action::Quit);
        assert_eq!(
            d.key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
            Action::Quit
        );
        d.key(key('?'));
        assert!(
            screen(&d, 80, 24)
                .0
                .contains("reset histograms and counters")
        );
    }

    #[test]
    fn the_hooks_in_use_show_in_the_help_and_on_a_wide_status_bar() {
        let mut d = Dashboard::new(false);
        let mut r = report();
        r.rungs = vec![
            RungInUse {
                metric: "fork",
                hook: "fentry",
                description: "fentry/fexit on kernel_clone",
            },
            RungInUse {
                metric: "accept_queue",
                hook: "fd-walk",
                description: "tracepoint exit + fd → socket walk",
            },
        ];
        d.update(r, status());
        let (wide, _) = screen(&d, 140, 24);
        assert!(
            wide.lines()
                .next()
                .unwrap()
                .contains("hooks fork:fentry accept_queue:fd-walk"),
            "{wide}"
        );
        d.key(key('?'));
        let (help, _) = screen(&d, 80, 24);
        assert!(
            help.contains("hooks fork:fentry accept_queue:fd-walk"),
            "{help}"
        );
    }

    #[test]
    fn a_role_expands_to_its_pids() {
        let mut d = Dashboard::new(false);
        d.update(report(), status());
        d.key(key('x'));
        let (text, _) = screen(&d, 80, 24);
        let lines: Vec<&str> = text.lines().collect();
        let pm = lines
            .iter()
            .position(|l| l.starts_with("postgres postmaster "))
            .unwrap();
        assert_eq!(
            lines[pm + 1].split_whitespace().collect::<Vec<_>>(),
            ["pid", "1", "412", "2.2µs", "2.4µs"],
            "{text}"
        );
        d.key(key('x'));
        assert!(!screen(&d, 80, 24).0.contains("pid 1 "));
    }

    #[test]
    fn no_color_means_no_colours() {
        let mut d = Dashboard::new(false);
        d.update(report(), status());
        let (_, buf) = screen(&d, 80, 24);
        assert!(
            buf.content().iter().all(|c| c.fg == Color::Reset),
            "a coloured cell without colour"
        );
        let mut coloured = Dashboard::new(true);
        coloured.update(report(), status());
        let (_, buf) = screen(&coloured, 80, 24);
        assert!(
            buf.content().iter().any(|c| c.fg == Color::Yellow),
            "the insight is yellow"
        );
    }
}
