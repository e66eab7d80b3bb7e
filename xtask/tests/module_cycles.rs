//! No module cycles: inside every workspace crate, the top-level modules import one another
//! without a cycle (DEVELOPERS.md: shared pieces get their own module).
//!
//! A module's imports are the `crate::NAME` paths of its code outside comments and outside
//! its `#[cfg(test)]` tail; a name the crate root re-exports (`pub use module::{A, B}`)
//! counts as an import of that module. Tests may import what they like.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's crates with a `src/` folder, as (name, `src` path).
fn workspace_sources() -> Vec<(String, PathBuf)> {
    let root = xtask::util::workspace_root();
    let mut out = Vec::new();
    let crates = std::fs::read_dir(root.join("crates")).expect("crates/");
    let mut dirs: Vec<PathBuf> = crates.map(|e| e.expect("entry").path()).collect();
    dirs.extend(["xtask", "benches", "fuzz"].map(|d| root.join(d)));
    dirs.sort();
    for dir in dirs {
        let src = dir.join("src");
        if src.is_dir() {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            out.push((name, src));
        }
    }
    out
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without comment lines and without its `#[cfg(test)]` tail: the
/// first `#[cfg(test)]` that opens a `mod` (one on a single `use` or item earlier in the
/// file gates only that item, and the code after it still counts).
fn code_of(text: &str) -> String {
    let code: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect();
    let tail = code.windows(2).position(|pair| {
        pair[0].trim() == "#[cfg(test)]" && pair[1].trim_start().starts_with("mod ")
    });
    code[..tail.unwrap_or(code.len())].join("\n")
}

/// The identifiers that follow `crate::` in `code`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    code.match_indices("crate::")
        .filter(|(i, _)| {
            // `crate::` itself, not the tail of `nx_crate::` or the like.
            code[..*i]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
        })
        .map(|(i, m)| {
            code[i + m.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// Names the crate root re-exports, mapped to their module (`pub use m::{A, B}` or
/// `pub use m::A`).
fn root_reexports(root: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let code = code_of(root);
    for stmt in code.split(';') {
        let Some(at) = stmt.find("pub use ") else {
            continue;
        };
        let path = stmt[at + "pub use ".len()..].trim();
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        if !modules.contains(module) {
            continue;
        }
        let names = rest.trim_start_matches('{').trim_end_matches('}');
        for name in names.split(',') {
            let name = name.split(" as ").last().unwrap_or("").trim();
            let name = name.rsplit("::").next().unwrap_or("").trim();
            if !name.is_empty() && name != "self" {
                out.insert(name.to_string(), module.to_string());
            }
        }
    }
    out
}

/// The import graph of a crate's top-level modules.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let module_of = |path: &Path| -> Option<String> {
        let rel = path.strip_prefix(src).ok()?;
        let first = rel.components().next()?.as_os_str().to_string_lossy();
        let name = first.trim_end_matches(".rs").to_string();
        (name != "lib" && name != "main" && !rel.starts_with("bin")).then_some(name)
    };
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(f)).collect();
    let mut reexports = BTreeMap::new();
    for root in ["lib.rs", "main.rs"] {
        if let Ok(text) = std::fs::read_to_string(src.join(root)) {
            reexports.extend(root_reexports(&text, &modules));
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(file) else {
            continue;
        };
        let code = code_of(&std::fs::read_to_string(file).expect("read"));
        let targets = graph.entry(module.clone()).or_default();
        for name in crate_paths(&code) {
            let target = if modules.contains(&name) {
                Some(name)
            } else {
                reexports.get(&name).cloned()
            };
            if let Some(t) = target.filter(|t| *t != module) {
                targets.insert(t);
            }
        }
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        let graph = s.graph;
        for w in graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut found = Vec::new();
    for (name, src) in workspace_sources() {
        for cycle in cycles(&module_graph(&src)) {
            found.push(format!("{name}: {}", cycle.join(" ↔ ")));
        }
    }
    assert!(
        found.is_empty(),
        "module cycles (move the shared piece into a module of its own):\n{}",
        found.join("\n")
    );
}

#[test]
fn checker_finds_direct_indirect_and_reexported_cycles() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(
        cycles(&graph(&[("a", "b"), ("b", "a")])),
        vec![vec!["a", "b"]]
    );
    assert_eq!(
        cycles(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])),
        vec![vec!["a", "b", "c"]]
    );
    assert!(cycles(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());

    let code = code_of(
        "use crate::plan::Plan;\n#[cfg(test)]\nuse crate::gated::Z;\n// crate::commented::X\n\
         fn f() { crate::tier::active(); nx_crate::x(); }\n\
         #[cfg(test)]\nmod tests { use crate::tests_only::Y; }\n",
    );
    // A test-only item early in the file does not hide the code after it.
    assert_eq!(
        crate_paths(&code).into_iter().collect::<Vec<_>>(),
        vec!["gated", "plan", "tier"]
    );
    let modules: BTreeSet<String> = ["project", "block"].map(String::from).into();
    let re = root_reexports(
        "mod block;\npub use project::{Projection, Projector as P};\npub use block::forward;\n",
        &modules,
    );
    assert_eq!(re.get("P").map(String::as_str), Some("project"));
    assert_eq!(re.get("Projection").map(String::as_str), Some("project"));
    assert_eq!(re.get("forward").map(String::as_str), Some("block"));
}
