//! The top-level modules of the library form no cycle: each can be read
//! knowing only those below it. A `use crate::x` that closes a loop
//! (`policy` uses `scoreboard` which uses `policy`) fails this test, which
//! names the files that make each edge of the loop.
//!
//! What counts as a use: a `crate::name` path in code, including inside
//! `use crate::{a, b::c}` groups. Comments, doc links and the unit tests at
//! the bottom of a file (`#[cfg(test)] mod tests`) do not count: they do
//! not make one module need another to build or to be understood.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// For each top-level module, the top-level modules it uses, and the files
/// where it does.
type Uses = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The code of a file: comment lines dropped, and cut at its unit tests.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first identifier at the start of `text`.
fn ident(text: &str) -> &str {
    let text = text.trim_start();
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The top-level names a piece of code reaches through `crate::`.
fn reached(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a, b::{c, d}, e}`: the names at depth 0 of the group.
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        names.insert(ident(&group[start..i]).to_string());
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.insert(ident(&group[start..i]).to_string());
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(ident(rest).to_string());
        }
    }
    names.remove("");
    names
}

/// Who uses whom among the top-level modules of `src`.
fn uses(src: &Path) -> Uses {
    let mut files = Vec::new();
    sources(src, &mut files);
    let top = |path: &Path| -> String {
        let first = path
            .strip_prefix(src)
            .expect("under src")
            .components()
            .next();
        let name = first.expect("a component").as_os_str().to_string_lossy();
        name.trim_end_matches(".rs").to_string()
    };
    let modules: BTreeSet<String> = files.iter().map(|f| top(f)).collect();
    let mut uses = Uses::new();
    for file in &files {
        let from = top(file);
        if from == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("a source file");
        for to in reached(&code(&text)) {
            if to != from && modules.contains(&to) {
                let shown = file.strip_prefix(src).expect("under src").display();
                uses.entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_default()
                    .insert(shown.to_string());
            }
        }
    }
    uses
}

/// A cycle through `start`, if there is one: the modules in order.
fn cycle_from(uses: &Uses, start: &str) -> Option<Vec<String>> {
    let mut path = vec![start.to_string()];
    let mut seen = BTreeSet::new();
    fn walk(uses: &Uses, start: &str, path: &mut Vec<String>, seen: &mut BTreeSet<String>) -> bool {
        let here = path.last().expect("a module").clone();
        for next in uses.get(&here).into_iter().flat_map(|m| m.keys()) {
            if next == start {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(uses, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    walk(uses, start, &mut path, &mut seen).then_some(path)
}

/// Every cycle, each described with the files that make its edges.
fn cycles(uses: &Uses) -> Vec<String> {
    let mut found = Vec::new();
    let mut reported = BTreeSet::new();
    for start in uses.keys() {
        if reported.contains(start) {
            continue;
        }
        if let Some(cycle) = cycle_from(uses, start) {
            let edges: Vec<String> = cycle
                .iter()
                .zip(cycle.iter().cycle().skip(1))
                .map(|(a, b)| format!("{a} -> {b} (in {:?})", uses[a][b]))
                .collect();
            reported.extend(cycle.iter().cloned());
            found.push(edges.join(", "));
        }
    }
    found
}

#[test]
fn the_top_level_modules_form_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = cycles(&uses(&src));
    assert!(
        found.is_empty(),
        "module cycles among crates/forkpool/src's top-level modules: {found:#?}; \
         move what both sides need below both (docs/architecture.md)"
    );
}

#[test]
fn uses_are_read_from_paths_and_groups_but_not_comments_or_tests() {
    let text = "use crate::a::X;\nuse crate::{b::{Y, Z}, c};\n// crate::d\n\
                fn f() { crate::e::g(); }\n#[cfg(test)]\nmod tests { use crate::h; }";
    let names: Vec<String> = reached(&code(text)).into_iter().collect();
    assert_eq!(names, ["a", "b", "c", "e"]);
}

#[test]
fn a_loop_of_three_is_found_and_a_chain_is_not() {
    let mut uses = Uses::new();
    let edge = |uses: &mut Uses, a: &str, b: &str| {
        uses.entry(a.into())
            .or_default()
            .entry(b.into())
            .or_default()
            .insert(format!("{a}.rs"));
    };
    edge(&mut uses, "a", "b");
    edge(&mut uses, "b", "c");
    assert!(cycles(&uses).is_empty());
    edge(&mut uses, "c", "a");
    let found = cycles(&uses);
    assert_eq!(found.len(), 1);
    assert!(found[0].starts_with("a -> b"), "{found:?}");
}
