//! `cargo xtask check-modules`: a module uses only modules below it, so the
//! modules of a crate must not depend on each other in a cycle. A module is
//! a file under the crate's source root; it depends on the module of each
//! path it names (the longest prefix of the path that is a module), except
//! its own ancestors, whose items (often re-exports) it may always use.

mod cycles;
mod paths;
mod tokens;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

use anyhow::{Context as _, Result, bail};

/// The source roots `cargo xtask test` checks: every crate's.
pub const CHECKED: [&str; 8] = [
    "cli/src",
    "cli/model/src",
    "cli/probes/src",
    "cli/collector/src",
    "cli/output/src",
    "probes-ebpf/src",
    "xtask/src",
    "probes-common/src",
];

/// Each module (`a::b`; the crate root is "") and the modules it uses.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// Checks each of `dirs` (source roots, relative to `root`), prints what it
/// found, and fails naming every cycle.
pub fn check(root: &Path, dirs: &[impl AsRef<str>]) -> Result<()> {
    let mut failures = Vec::new();
    for dir in dirs {
        let dir = dir.as_ref();
        let sources = module_sources(&root.join(dir))?;
        let graph = graph(&sources);
        let found = cycles::cycles(&graph);
        if found.is_empty() {
            println!("check-modules: {dir}: {} modules, no cycle", graph.len());
            continue;
        }
        println!("check-modules: {dir}: {} cycle(s)", found.len());
        for cycle in &found {
            println!("  [{}]", cycle.join(", "));
            for module in cycle {
                let inside: Vec<&str> = graph[module]
                    .iter()
                    .filter(|m| cycle.contains(m))
                    .map(String::as_str)
                    .collect();
                println!("    {module} uses {}", inside.join(", "));
            }
        }
        let listed: Vec<String> = found
            .iter()
            .map(|c| format!("[{}]", c.join(", ")))
            .collect();
        failures.push(format!("{dir}: {}", listed.join(", ")));
    }
    if !failures.is_empty() {
        bail!(
            "modules depend on each other in a cycle (a module may use only modules below it): {}",
            failures.join("; ")
        );
    }
    Ok(())
}

/// Every module file under `src`, as (module path, source), sorted. lib.rs
/// and main.rs are both the root; src/bin holds crates of their own.
fn module_sources(src: &Path) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut dirs = vec![(src.to_path_buf(), Vec::<String>::new())];
    while let Some((dir, parents)) = dirs.pop() {
        let entries = fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
        for entry in entries {
            let path = entry?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if path.is_dir() {
                if !(parents.is_empty() && name == "bin") {
                    let mut below = parents.clone();
                    below.push(name.to_string());
                    dirs.push((path, below));
                }
                continue;
            }
            let Some(stem) = name.strip_suffix(".rs") else {
                continue;
            };
            let mut module = parents.clone();
            let is_root = parents.is_empty() && (stem == "lib" || stem == "main");
            if !is_root && stem != "mod" {
                module.push(stem.to_string());
            }
            let source =
                fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            out.push((module.join("::"), source));
        }
    }
    out.sort();
    Ok(out)
}

fn graph(sources: &[(String, String)]) -> Graph {
    let modules: BTreeSet<&str> = sources.iter().map(|(m, _)| m.as_str()).collect();
    let mut graph: Graph = modules
        .iter()
        .map(|m| (m.to_string(), BTreeSet::new()))
        .collect();
    for (module, source) in sources {
        let here: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
        let uses = graph.get_mut(module).expect("every module is a node");
        for path in paths::referenced(source, &here) {
            let Some(target) = (1..=path.len())
                .rev()
                .map(|k| path[..k].join("::"))
                .find(|m| modules.contains(m.as_str()))
            else {
                continue;
            };
            let is_ancestor = module.starts_with(&format!("{target}::"));
            if target != *module && !is_ancestor {
                uses.insert(target);
            }
        }
    }
    graph
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph_of(files: &[(&str, &str)]) -> Graph {
        let sources: Vec<(String, String)> = files
            .iter()
            .map(|(m, s)| (m.to_string(), s.to_string()))
            .collect();
        graph(&sources)
    }

    fn uses(graph: &Graph, module: &str) -> Vec<String> {
        graph[module].iter().cloned().collect()
    }

    #[test]
    fn paths_map_to_the_longest_module_prefix() {
        let g = graph_of(&[
            ("", "mod model; mod view;"),
            ("model", "pub mod report; pub use report::Report;"),
            ("model::report", "pub struct Report;"),
            (
                "view",
                "use crate::model::{report::Report, Histogram}; fn f() { crate::nowhere::g(); }",
            ),
        ]);
        assert_eq!(uses(&g, "view"), ["model", "model::report"]);
        assert!(cycles::cycles(&g).is_empty());
    }

    #[test]
    fn ancestors_are_not_dependencies() {
        // A child using its parent's re-exports and the parent using the
        // child are no cycle.
        let g = graph_of(&[
            ("", ""),
            (
                "probes",
                "pub use self::loader::Loader; fn f() { crate::probes::loader::go() }",
            ),
            (
                "probes::loader",
                "use super::Shared; use crate::probes::Other;",
            ),
        ]);
        assert_eq!(uses(&g, "probes"), ["probes::loader"]);
        assert!(uses(&g, "probes::loader").is_empty());
        assert!(cycles::cycles(&g).is_empty());
    }

    #[test]
    fn siblings_using_each_other_are_a_cycle() {
        let g = graph_of(&[
            ("", ""),
            ("model", ""),
            ("model::links", "use super::process::Tree;"),
            (
                "model::process",
                "fn f() -> crate::model::links::Link { todo!() }",
            ),
            ("view", "use crate::model::links;"),
        ]);
        assert_eq!(
            cycles::cycles(&g),
            [vec![
                "model::links".to_string(),
                "model::process".to_string()
            ]]
        );
    }

    #[test]
    fn test_modules_make_no_cycle() {
        let g = graph_of(&[
            ("a", "use crate::b::B;"),
            (
                "b",
                "pub struct B;\n#[cfg(test)]\nmod tests { use crate::a; }",
            ),
        ]);
        assert!(cycles::cycles(&g).is_empty());
    }

    #[test]
    fn the_checked_roots_have_no_cycle() {
        let root = crate::process::workspace_root();
        check(&root, &CHECKED).unwrap();
    }
}
