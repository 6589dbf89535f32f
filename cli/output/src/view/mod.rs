//! Views render the model's reports; they compute nothing of their own.

pub mod json;
pub mod text;
pub mod tui;

use stackprobe_model::report::TcpReport;

/// Says how old the TIME_WAIT counts are when the last walk of the sockets
/// is a second or more old (walks are spaced out when they are costly).
pub fn time_wait_age(tcp: &TcpReport) -> Option<String> {
    (tcp.walk_age_ms >= 1000).then(|| {
        format!(
            "TIME_WAIT as of {:.0} s ago ({} sockets, walked less often when many)",
            tcp.walk_age_ms as f64 / 1000.0,
            tcp.sockets
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_old_walk_is_said_and_a_fresh_one_is_not() {
        let mut tcp = TcpReport {
            sockets: 12000,
            walk_age_ms: 999,
            ..Default::default()
        };
        assert_eq!(time_wait_age(&tcp), None);
        tcp.walk_age_ms = 4200;
        let said = time_wait_age(&tcp).expect("a 4 s old walk is said");
        assert!(
            said.starts_with("TIME_WAIT as of 4 s ago (12000 sockets"),
            "{said}"
        );
    }
}
