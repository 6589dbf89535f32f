//! The live dashboard: an overview of roles, a detail view of one, insights
//! and a status bar. Rendering only: it draws the reports the model builds.
//!
//! - `state`: the dashboard's state and what each key does to it
//! - `overview`: the roles' table and the status bar
//! - `detail`: one role's percentiles, bars, history and links
//! - `path`: in the detail, the chain of roles the selected one is on
//! - `insights`: the warnings and insights under every screen
//! - `help`: the keys, and the hooks in use
//! - `terminal`: the terminal while the dashboard runs

mod detail;
mod help;
mod insights;
mod overview;
mod path;
mod state;
pub mod terminal;
#[cfg(test)]
mod tests;

use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::Color,
    widgets::Paragraph,
};

use state::Screen;
pub use state::{Action, Dashboard, Status};

pub fn render(frame: &mut Frame, d: &Dashboard) {
    let [status, main, insights_area, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(6),
        Constraint::Length(4),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    overview::render_status(frame, status, d);
    let lines = d.lines();
    let selected = d.selected.min(lines.len().saturating_sub(1));
    match (d.screen, lines.get(selected)) {
        (Screen::Detail, Some(line)) => detail::render_detail(frame, main, d, line),
        _ => overview::render_overview(frame, main, d, &lines, selected),
    }
    insights::render_insights(frame, insights_area, d);
    render_footer(frame, footer, d);
    if d.help {
        help::render_help(frame, main, d.report.as_ref());
    }
}

/// The keys, or the filter being typed.
fn render_footer(frame: &mut Frame, area: Rect, d: &Dashboard) {
    let hint = if d.filtering {
        format!("filter: {}_  (Enter/Esc to finish)", d.filter)
    } else {
        "q quit  p pause  r reset  s/S sort  / filter  x pids  Enter/Esc detail  ? help".to_string()
    };
    frame.render_widget(Paragraph::new(hint).style(d.style(Color::DarkGray)), area);
}
