//! Cycles in a directed graph: its strongly connected components of more
//! than one node (Tarjan's algorithm).

use std::collections::{BTreeMap, BTreeSet};

/// Each cycle's nodes sorted, and the cycles sorted. Edges to nodes that
/// are not keys are ignored; the graph has no edge from a node to itself.
pub fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let nodes: Vec<&String> = edges.keys().collect();
    let index_of: BTreeMap<&String, usize> =
        nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let successors: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            edges[*n]
                .iter()
                .filter_map(|m| index_of.get(m).copied())
                .collect()
        })
        .collect();
    let mut tarjan = Tarjan {
        successors: &successors,
        index: vec![None; nodes.len()],
        low: vec![0; nodes.len()],
        stack: Vec::new(),
        on_stack: vec![false; nodes.len()],
        next: 0,
        components: Vec::new(),
    };
    for v in 0..nodes.len() {
        if tarjan.index[v].is_none() {
            tarjan.visit(v);
        }
    }
    let mut found: Vec<Vec<String>> = tarjan
        .components
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut names: Vec<String> = c.into_iter().map(|i| nodes[i].clone()).collect();
            names.sort();
            names
        })
        .collect();
    found.sort();
    found
}

struct Tarjan<'a> {
    successors: &'a [Vec<usize>],
    /// Visit order; `None` until visited.
    index: Vec<Option<usize>>,
    /// The lowest visit index reachable through the stack.
    low: Vec<usize>,
    stack: Vec<usize>,
    on_stack: Vec<bool>,
    next: usize,
    components: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    /// Recursive: module graphs are a few dozen nodes deep at most.
    fn visit(&mut self, v: usize) {
        self.index[v] = Some(self.next);
        self.low[v] = self.next;
        self.next += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for &w in &self.successors[v] {
            match self.index[w] {
                None => {
                    self.visit(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(index) if self.on_stack[w] => self.low[v] = self.low[v].min(index),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut component = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        edges
            .iter()
            .map(|(from, to)| (from.to_string(), to.iter().map(|t| t.to_string()).collect()))
            .collect()
    }

    #[test]
    fn a_dag_has_no_cycle() {
        let g = graph(&[
            ("a", &["b", "c"]),
            ("b", &["c"]),
            ("c", &[]),
            ("d", &["a", "c"]),
        ]);
        assert!(cycles(&g).is_empty());
    }

    #[test]
    fn finds_each_cycle_with_its_members() {
        // a -> b -> c -> a, and d <-> e beside them; f only points into a
        // cycle and g hangs off one.
        let g = graph(&[
            ("a", &["b"]),
            ("b", &["c", "g"]),
            ("c", &["a"]),
            ("d", &["e"]),
            ("e", &["d", "a"]),
            ("f", &["a"]),
            ("g", &[]),
        ]);
        assert_eq!(cycles(&g), [vec!["a", "b", "c"], vec!["d", "e"]]);
    }

    #[test]
    fn edges_to_unknown_nodes_are_ignored() {
        let g = graph(&[("a", &["outside"]), ("b", &["a"])]);
        assert!(cycles(&g).is_empty());
    }
}
