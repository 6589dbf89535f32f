//! `--json`: one JSON object per line, per report. Fields are documented in
//! docs/json.md and named by `model::report`.

use stackprobe_model::report::Report;

pub fn render(report: &Report) -> String {
    serde_json::to_string(report).expect("reports contain only serialisable values")
}
