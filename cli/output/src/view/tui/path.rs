//! The path a selected role is on: the chain's hops side by side (the
//! means of their connect, queue wait and service time, their threads'
//! run-queue wait when measured, their own time,
//! busy connections and connections lost at their queue), the hop holding
//! the most own time marked.

use ratatui::{
    Frame,
    layout::{Constraint, Rect},
    style::{Color, Modifier, Style},
    widgets::{Block, Borders, Cell, Row, Table},
};

use stackprobe_model::report::{Chain, HopLatency, RoleRow};

use super::{overview::ns, state::Dashboard};

/// The chain `r` is on, if any.
pub(super) fn chain_of<'a>(d: &'a Dashboard, r: &RoleRow) -> Option<&'a Chain> {
    d.report
        .as_ref()?
        .chains
        .iter()
        .find(|c| c.hops.iter().any(|h| h.role == r.role))
}

/// The lines the section takes: a title, a header, a row per hop, and the
/// first hop's note on why it has no own time, if one has none.
pub(super) fn height(c: &Chain) -> u16 {
    let note = c.hops.iter().any(|h| h.note.is_some());
    c.hops.len() as u16 + 2 + u16::from(note)
}

pub(super) fn render_path(frame: &mut Frame, area: Rect, d: &Dashboard, c: &Chain) {
    let mean = |l: &HopLatency| ns(l.mean_ns, l.count);
    // The hops' run-queue waits, only where the run-queue probe measured
    // one (`--run-queue`).
    let run_queue = c.hops.iter().any(|h| h.run_queue.count > 0);
    let holder = d.style(Color::Red).add_modifier(Modifier::BOLD);
    let mut rows: Vec<Row<'_>> = c
        .hops
        .iter()
        .map(|h| {
            let held = c.holder.as_deref() == Some(h.role.as_str());
            let busy = h.busy.as_ref().map_or_else(String::new, |b| {
                let limit = b
                    .limit
                    .as_ref()
                    .map_or_else(String::new, |l| format!(" of {}", l.value));
                format!("{:.1}/{}{limit}", b.mean, b.max)
            });
            let lost = h
                .lost
                .filter(|l| l.total > 0)
                .map_or_else(String::new, |l| l.count.to_string());
            let own = h.own_ns.map_or_else(|| "-".to_string(), |o| ns(o, 1));
            let mut cells = vec![
                Cell::from(format!("{}{}", if held { "● " } else { "  " }, h.role)),
                Cell::from(h.via.join(", ")),
                Cell::from(h.connect.as_ref().map_or_else(|| "-".into(), mean)),
                Cell::from(mean(&h.accept_queue)),
                Cell::from(mean(&h.service)),
            ];
            if run_queue {
                cells.push(Cell::from(mean(&h.run_queue)));
            }
            cells.extend([Cell::from(own), Cell::from(busy), Cell::from(lost)]);
            let row = Row::new(cells);
            if held { row.style(holder) } else { row }
        })
        .collect();
    if let Some(h) = c.hops.iter().find(|h| h.note.is_some()) {
        let note = format!("  {}: {}", h.role, h.note.as_deref().unwrap_or_default());
        rows.push(Row::new(vec![Cell::from(note)]).style(d.style(Color::DarkGray)));
    }
    let role_width = c
        .hops
        .iter()
        .map(|h| h.role.chars().count() + 2)
        .max()
        .unwrap_or(12)
        .clamp(8, 30);
    let title = format!(
        " path: means · own = service − the next hop's · ● holds the most{} ",
        c.holder
            .as_deref()
            .map_or_else(|| ": none yet".to_string(), |h| format!(": {h}"))
    );
    let mut widths = vec![
        Constraint::Length(role_width as u16),
        Constraint::Min(8),
        Constraint::Length(7),
        Constraint::Length(6),
        Constraint::Length(7),
    ];
    let mut header = vec!["hop", "via", "connect", "queue", "service"];
    if run_queue {
        widths.push(Constraint::Length(6));
        header.push("runq");
    }
    widths.extend([
        Constraint::Length(6),
        Constraint::Length(11),
        Constraint::Length(5),
    ]);
    header.extend(["own", "busy", "lost"]);
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(Style::default().add_modifier(Modifier::BOLD)))
        .block(Block::default().borders(Borders::TOP).title(title));
    frame.render_widget(table, area);
}
