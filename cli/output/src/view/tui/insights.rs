//! The insights box under every screen: warnings first, then insights.

use ratatui::{
    Frame,
    layout::Rect,
    style::Color,
    text::{Line, Span},
    widgets::{Block, Borders, Paragraph, Wrap},
};

use super::state::Dashboard;

pub(super) fn render_insights(frame: &mut Frame, area: Rect, d: &Dashboard) {
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
