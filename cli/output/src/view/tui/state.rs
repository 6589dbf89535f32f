//! The dashboard's state, and what each key does to it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ratatui::{
    crossterm::event::{KeyCode, KeyEvent, KeyModifiers},
    style::{Color, Style},
};

use stackprobe_model::{
    measure::Latency,
    report::{Report, RoleRow},
};

/// Interval samples kept per role for the time series.
const HISTORY: usize = 120;

/// One interval of a role's time series.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Sample {
    pub accepts_per_s: u64,
    pub accept_p99_us: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SortColumn {
    Role,
    Accepts,
    AcceptP99,
    Forks,
    ForkP99,
    TimeWait,
}

/// The sort columns in the order `s` steps through them.
const SORTS: [SortColumn; 6] = [
    SortColumn::Accepts,
    SortColumn::AcceptP99,
    SortColumn::Forks,
    SortColumn::ForkP99,
    SortColumn::TimeWait,
    SortColumn::Role,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Screen {
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
pub(super) struct RoleLine<'a> {
    pub role: &'a RoleRow,
    pub time_wait: u64,
    pub time_wait_per_s: f64,
}

pub struct Dashboard {
    pub(super) report: Option<Report>,
    pub(super) history: BTreeMap<String, VecDeque<Sample>>,
    pub status: Status,
    pub(super) selected: usize,
    pub(super) sort: SortColumn,
    pub(super) reverse: bool,
    pub(super) screen: Screen,
    pub(super) paused: bool,
    pub(super) help: bool,
    pub(super) filter: String,
    pub(super) filtering: bool,
    color: bool,
    /// Roles shown with one line per pid.
    pub(super) expanded: BTreeSet<String>,
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
            expanded: BTreeSet::new(),
        }
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
            self.filter_key(key.code);
            return Action::None;
        }
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Char('p') => self.paused = !self.paused,
            KeyCode::Char('r') => {
                self.history.clear();
                return Action::Reset;
            }
            KeyCode::Char('s') => self.next_sort(),
            KeyCode::Char('S') => self.reverse = !self.reverse,
            KeyCode::Char('/') => {
                self.filtering = true;
                self.filter.clear();
            }
            KeyCode::Char('?') => self.help = !self.help,
            KeyCode::Char('x') | KeyCode::Right | KeyCode::Left => self.toggle_pids(),
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

    /// A key while the filter is typed: it edits the filter until Enter or
    /// Esc, and the selection goes back to the top.
    fn filter_key(&mut self, code: KeyCode) {
        match code {
            KeyCode::Enter | KeyCode::Esc => self.filtering = false,
            KeyCode::Backspace => {
                self.filter.pop();
            }
            KeyCode::Char(c) => self.filter.push(c),
            _ => {}
        }
        self.selected = 0;
    }

    fn next_sort(&mut self) {
        let i = SORTS.iter().position(|&s| s == self.sort).unwrap_or(0);
        self.sort = SORTS[(i + 1) % SORTS.len()];
    }

    /// Shows or hides the selected role's pids.
    fn toggle_pids(&mut self) {
        if let Some(role) = self.selected_role()
            && !self.expanded.remove(&role)
        {
            self.expanded.insert(role);
        }
    }

    fn selected_role(&self) -> Option<String> {
        let lines = self.lines();
        let i = self.selected.min(lines.len().checked_sub(1)?);
        Some(lines[i].role.role.clone())
    }

    /// The roles the filter lets through, in the chosen order.
    pub(super) fn lines(&self) -> Vec<RoleLine<'_>> {
        let Some(report) = &self.report else {
            return Vec::new();
        };
        let mut lines: Vec<RoleLine<'_>> = report
            .roles
            .iter()
            .filter(|r| self.filter.is_empty() || r.role.contains(&self.filter))
            .map(|role| role_line(report, role))
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

    pub(super) fn style(&self, color: Color) -> Style {
        if self.color {
            Style::default().fg(color)
        } else {
            Style::default()
        }
    }

    /// Green, yellow or red by thresholds (plain without colour).
    pub(super) fn level(&self, value: f64, warn: f64, bad: f64) -> Style {
        if value >= bad {
            self.style(Color::Red)
        } else if value >= warn {
            self.style(Color::Yellow)
        } else {
            Style::default()
        }
    }
}

/// `role`'s line, with the TIME_WAIT of the links it owns.
fn role_line<'a>(report: &Report, role: &'a RoleRow) -> RoleLine<'a> {
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
}
