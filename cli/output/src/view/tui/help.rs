//! The keys' help, over the main area, and the hooks this kernel gave.

use ratatui::{
    Frame,
    layout::Rect,
    widgets::{Block, Borders, Clear, Paragraph},
};

use stackprobe_model::report::Report;

const KEYS: &str = "q, Ctrl-C   quit
p           pause the view (collection goes on)
r           reset histograms and counters
s / S       next sort column / reverse
/           filter roles by name
↑ ↓         select a role
x, ← →      show / hide the role's pids
Enter, Tab  detail of the selected role
Esc         back to the overview
?           this help";

/// `hooks fork:fentry accept_queue:fexit`.
pub(super) fn hooks_line(r: &Report) -> String {
    let hooks: Vec<String> = r
        .rungs
        .iter()
        .map(|h| format!("{}:{}", h.metric, h.hook))
        .collect();
    format!("hooks {}", hooks.join(" "))
}

pub(super) fn render_help(frame: &mut Frame, area: Rect, report: Option<&Report>) {
    let mut help = KEYS.to_string();
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
