//! The dashboard drawn on a test terminal: what each screen shows, and
//! what the keys do to it.

use ratatui::{
    Terminal,
    backend::TestBackend,
    crossterm::event::{KeyCode, KeyEvent, KeyModifiers},
    style::Color,
};

use super::*;
use stackprobe_model::{
    fixtures::{self, fork_per_connection, live},
    probe_stats::RungInUse,
    process::ProcessTable,
    report::Report,
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
    // Without --run-queue, no run-queue column.
    assert!(!text.contains("RQp99"), "{text}");
}

#[test]
fn the_run_queue_wait_has_a_column_once_measured_and_a_dash_where_a_role_has_none() {
    use stackprobe_model::{event::HistMetric, fixtures::kernel_hist};
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "postgres"), live(2, "nginx")]);
    let latencies: Vec<u64> = (0..412).map(|i| 2_000 + i).collect();
    fork_per_connection(&mut t, 1, "postgres", &latencies, 90_000, 412, 9_000_000);
    // The postmaster's threads waited 3 ms for a CPU, 30 times; nginx's
    // were not seen waiting.
    t.apply(&kernel_hist(
        1,
        "postgres",
        HistMetric::RunQueue,
        &[3_000_000; 30],
    ));
    let mut d = Dashboard::new(true);
    d.update(fixtures::interval_report(&t), status());
    let (text, buf) = screen(&d, 100, 24);
    let lines: Vec<&str> = text.lines().collect();
    let header = lines
        .iter()
        .find(|l| l.starts_with("ROLE"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(header.ends_with("TW+/s RQp99"), "{header}");
    let row = |start: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no {start:?} in\n{text}"))
    };
    let pm = row("postgres postmaster");
    assert!(lines[pm].ends_with(" 3.0ms"), "{}", lines[pm]);
    assert!(lines[row("nginx")].ends_with(" -"), "{text}");
    // Past a millisecond, yellow.
    let x = lines[pm].rfind("3.0ms").unwrap() as u16;
    assert_eq!(buf[(x, pm as u16)].fg, Color::Yellow);
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
    assert!(d.paused);
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

#[test]
fn the_detail_of_a_role_on_a_chain_shows_its_hops_side_by_side_with_the_holder() {
    let mut t = ProcessTable::default();
    fixtures::three_hops(&mut t, 100);
    let mut d = Dashboard::new(true);
    d.update(fixtures::interval_report(&t), status());
    for c in "/php".chars() {
        d.key(key(c));
    }
    d.key(KeyEvent::from(KeyCode::Enter));
    d.key(KeyEvent::from(KeyCode::Enter));
    let (text, buf) = screen(&d, 100, 40);
    assert!(text.contains("path: means"), "{text}");
    assert!(text.contains("● holds the most: postgres"), "{text}");
    let row = |start: &str| {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no {start:?} in\n{text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        row("hop "),
        [
            "hop", "via", "connect", "queue", "service", "own", "busy", "lost"
        ]
    );
    assert_eq!(row("  nginx"), ["nginx", "-", "30µs", "100ms", "8.0ms"]);
    assert_eq!(
        row("  php-fpm"),
        [
            "php-fpm",
            "/run/php/php-fpm.sock",
            "40µs",
            "12ms",
            "80ms",
            "29ms"
        ]
    );
    assert_eq!(
        row("● postgres"),
        [
            "●",
            "postgres",
            "127.0.0.1:5432",
            "15µs",
            "1.0ms",
            "50ms",
            "50ms"
        ]
    );
    // No run-queue wait measured: no column for it, no row in the table.
    assert!(!text.contains("runq"), "{text}");
    assert!(!text.contains("fork "), "never measured: {text}");
    // The holder's row stands out.
    let y = text
        .lines()
        .position(|l| l.starts_with("● postgres"))
        .unwrap() as u16;
    assert_eq!(buf[(2, y)].fg, Color::Red);
    // Measured (--run-queue): each hop's mean wait, `-` where none.
    fixtures::three_hops(&mut t, 100);
    t.apply(&stackprobe_model::fixtures::kernel_hist(
        12,
        "php-fpm",
        stackprobe_model::event::HistMetric::RunQueue,
        &[2_000_000],
    ));
    d.update(fixtures::interval_report(&t), status());
    let (text, _) = screen(&d, 100, 40);
    let row = |start: &str| {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no {start:?} in\n{text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        row("hop "),
        [
            "hop", "via", "connect", "queue", "service", "runq", "own", "busy", "lost"
        ]
    );
    assert_eq!(
        row("  php-fpm"),
        [
            "php-fpm",
            "/run/php/php-fpm.sock",
            "40µs",
            "12ms",
            "80ms",
            "2.0ms",
            "29ms"
        ]
    );
    assert_eq!(
        row("  nginx"),
        ["nginx", "-", "30µs", "100ms", "-", "8.0ms"]
    );
    // A role on no chain has no path section.
    let mut alone = Dashboard::new(false);
    alone.update(report(), status());
    alone.key(KeyEvent::from(KeyCode::Enter));
    assert!(!screen(&alone, 100, 40).0.contains("path:"));
}
