//! `cargo xtask check-layers`: the one rule about cli's crates the compiler
//! cannot hold to by itself. A crate cannot name a crate it does not depend
//! on, and a dependency that closes a cycle does not build; but nothing
//! stops a Cargo.toml from adding a wrong-way dependency that closes none
//! (the output crate on the collector, the model on aya or a terminal).
//! This reads each layer's dependencies from `cargo metadata` and fails on
//! any the layer may not have.

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::process::{cargo, workspace_root};

/// One layer: its crate, the workspace crates it may use, and the outside
/// crates it must not (what would let it reach the kernel, /proc or a
/// terminal).
struct Layer {
    krate: &'static str,
    may_use: &'static [&'static str],
    must_not_use: &'static [&'static str],
}

/// What draws on a terminal.
const TERMINAL: &[&str] = &["ratatui", "crossterm"];

/// Top to bottom: each uses only the ones after it.
const LAYERS: &[Layer] = &[
    Layer {
        krate: "stackprobe",
        may_use: &[
            "stackprobe-output",
            "stackprobe-collector",
            "stackprobe-probes",
            "stackprobe-model",
            "probes-common",
        ],
        must_not_use: &[],
    },
    Layer {
        krate: "stackprobe-output",
        may_use: &["stackprobe-model"],
        must_not_use: &["aya", "aya-log", "aya-obj", "caps"],
    },
    Layer {
        krate: "stackprobe-collector",
        may_use: &["stackprobe-probes", "stackprobe-model"],
        must_not_use: TERMINAL,
    },
    Layer {
        krate: "stackprobe-probes",
        may_use: &["stackprobe-model", "probes-common", "probes-ebpf"],
        must_not_use: TERMINAL,
    },
    Layer {
        krate: "stackprobe-model",
        may_use: &["probes-common"],
        must_not_use: &[
            "aya",
            "aya-log",
            "aya-obj",
            "caps",
            "libc",
            "tokio",
            "ratatui",
            "crossterm",
        ],
    },
];

pub fn check() -> Result<()> {
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .current_dir(workspace_root())
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let metadata: Value = serde_json::from_slice(&out.stdout).context("reading cargo metadata")?;
    let failures = wrong_way(&metadata)?;
    if !failures.is_empty() {
        bail!("layers used the wrong way:\n  {}", failures.join("\n  "));
    }
    println!(
        "check-layers: {} layers, each using only those below it",
        LAYERS.len()
    );
    Ok(())
}

/// Every dependency (normal or build; tests may use anything) a layer may
/// not have.
fn wrong_way(metadata: &Value) -> Result<Vec<String>> {
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata lists no packages")?;
    let workspace: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut failures = Vec::new();
    for layer in LAYERS {
        let package = packages
            .iter()
            .find(|p| p["name"] == layer.krate)
            .with_context(|| format!("no package {} in the workspace", layer.krate))?;
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            let name = dep["name"].as_str().unwrap_or_default();
            if dep["kind"] == "dev" {
                continue;
            }
            let ours = workspace.contains(&name);
            if (ours && !layer.may_use.contains(&name)) || layer.must_not_use.contains(&name) {
                failures.push(format!("{} depends on {name}", layer.krate));
            }
        }
    }
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(model_deps: &[&str]) -> Value {
        let deps = |names: &[&str]| -> Value {
            names
                .iter()
                .map(|n| serde_json::json!({"name": n, "kind": null}))
                .collect()
        };
        serde_json::json!({"packages": [
            {"name": "stackprobe", "dependencies": deps(&["stackprobe-output"])},
            {"name": "stackprobe-output", "dependencies": deps(&["stackprobe-model", "ratatui"])},
            {"name": "stackprobe-collector", "dependencies": deps(&["stackprobe-probes"])},
            {"name": "stackprobe-probes", "dependencies": deps(&["stackprobe-model", "aya"])},
            {"name": "stackprobe-model", "dependencies": deps(model_deps)},
            {"name": "probes-common", "dependencies": []},
        ]})
    }

    #[test]
    fn a_wrong_way_dependency_is_named_and_a_right_one_passes() {
        assert!(
            wrong_way(&metadata(&["probes-common", "serde"]))
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            wrong_way(&metadata(&["stackprobe-output", "aya"])).unwrap(),
            [
                "stackprobe-model depends on stackprobe-output",
                "stackprobe-model depends on aya"
            ]
        );
    }

    /// So a wrong-way Cargo.toml fails `cargo test` too.
    #[test]
    fn this_workspace_keeps_its_layers() {
        check().unwrap();
    }
}
