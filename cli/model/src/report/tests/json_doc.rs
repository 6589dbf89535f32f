//! docs/json.md's table, read as the list of documented fields.

use serde_json::Value;

/// Each row: the field paths its first cell names (`roles[].accept`,
/// `.fork`: a sibling of the first), and the field names its text
/// gives in backquotes (`{count, total}` gives two). A row whose
/// text starts with the name of a shape row (`metric`, `count`)
/// has that shape's fields too.
pub struct Fields(Vec<(Vec<String>, Vec<String>)>);

fn names(quoted: &str) -> impl Iterator<Item = String> + '_ {
    quoted
        .split(['{', '}', ',', ' ', '`'])
        .map(|n| n.trim_end_matches("[]"))
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}

impl Fields {
    pub fn read() -> Self {
        let doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/json.md"));
        let quoted =
            |s: &str| -> Vec<String> { s.split('`').skip(1).step_by(2).flat_map(names).collect() };
        let rows: Vec<(Vec<String>, Vec<String>, String)> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .map(|row| {
                let (cell, text) = row.split_once(" | ").unwrap_or((row, ""));
                let cell_names: Vec<String> = cell
                    .split('`')
                    .step_by(2)
                    .map(|n| n.trim_end_matches("[]").to_string())
                    .filter(|n| !n.is_empty() && n != ", ")
                    .collect();
                let first = cell_names[0].clone();
                let parent = first.rsplit_once('.').map_or("", |(p, _)| p).to_string();
                let paths = cell_names
                    .iter()
                    .map(|n| match n.strip_prefix('.') {
                        Some(sibling) => format!("{parent}.{sibling}"),
                        None if n.contains('.') || parent.is_empty() => n.clone(),
                        None => format!("{parent}.{n}"),
                    })
                    .collect();
                (paths, quoted(text), text.to_string())
            })
            .collect();
        let shape = |name: &str| {
            rows.iter()
                .find(|(paths, _, _)| paths == &[name.to_string()])
                .map(|(_, fields, _)| fields.clone())
                .unwrap_or_default()
        };
        let (metric, count) = (shape("metric"), shape("count"));
        Self(
            rows.iter()
                .map(|(paths, fields, text)| {
                    let mut fields = fields.clone();
                    if text.starts_with("metric") {
                        fields.extend(metric.iter().cloned());
                    }
                    if text.starts_with("count") {
                        fields.extend(count.iter().cloned());
                    }
                    (paths.clone(), fields)
                })
                .collect(),
        )
    }

    /// `path` is documented: named in a row, the parent of fields
    /// named, or described in the row of one of its ancestors.
    pub fn covers(&self, path: &str) -> bool {
        let path = path.replace("[]", "");
        let named = self.0.iter().any(|(paths, _)| {
            paths.iter().any(|d| {
                let d = d.replace("[]", "");
                d == path || d.starts_with(&format!("{path}."))
            })
        });
        if named {
            return true;
        }
        let mut ancestor = path.as_str();
        while let Some((up, _)) = ancestor.rsplit_once('.') {
            let field = path[up.len() + 1..].split('.').next().unwrap_or("");
            if self.0.iter().any(|(paths, fields)| {
                paths.iter().any(|d| d.replace("[]", "") == up) && fields.iter().any(|f| f == field)
            }) {
                return true;
            }
            ancestor = up;
        }
        false
    }
}

/// Hands `f` the path of every field of `v` down to `depth` levels
/// (`roles[].accept.count`: arrays are walked through their first
/// element).
pub fn walk(v: &Value, prefix: &str, depth: usize, f: &mut impl FnMut(&str)) {
    if depth == 0 {
        return;
    }
    let Value::Object(map) = v else { return };
    for (key, value) in map {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        f(&path);
        match value {
            Value::Array(items) => {
                if let Some(first) = items.first() {
                    walk(first, &format!("{path}[]"), depth - 1, f);
                }
            }
            other => walk(other, &path, depth - 1, f),
        }
    }
}
