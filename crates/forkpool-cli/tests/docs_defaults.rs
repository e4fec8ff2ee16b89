//! The docs say what runs: the default dispatch mode every page names is
//! the one `forkpool check` reports, and the lists of modes leave none out.

use std::path::PathBuf;
use std::process::Command;

/// Every dispatch mode `forkpool run` takes.
const MODES: [&str; 5] = ["kernel", "handoff", "order", "shared", "none"];

/// The pages a new user reads to choose a mode.
const PAGES: [&str; 4] = [
    "README.md",
    "docs/workers.md",
    "docs/protocol.md",
    "docs/operations.md",
];

fn read_page(page: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
    // Markdown wraps lines anywhere: read each page as one line.
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The default mode as the binary resolves it, from `forkpool check`'s
/// `dispatch MODE, ...` line.
fn binary_default() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_forkpool"))
        .arg("check")
        .output()
        .expect("run forkpool check");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mode = text
        .split_whitespace()
        .skip_while(|w| *w != "dispatch")
        .nth(1)
        .unwrap_or_else(|| panic!("no dispatch line in forkpool check: {text}"));
    mode.trim_end_matches(',').to_string()
}

/// Every mode a page calls the default, in the ways the pages say it:
/// "`M` (default)", "`M` dispatch (the default)", "`M` mode (the
/// default)", "`M`, the default", "the default, `M`", "default dispatch
/// mode is `M`".
fn defaults_named(text: &str) -> Vec<&'static str> {
    let mut named = Vec::new();
    for mode in MODES {
        let m = format!("`{mode}`");
        let phrases = [
            format!("{m} (default)"),
            format!("{m} (the default)"),
            format!("{m} dispatch (the default)"),
            format!("{m} mode (the default)"),
            format!("{m}, the default"),
            format!("the default, {m}"),
            format!("default dispatch mode is {m}"),
            format!("default mode is {m}"),
        ];
        for phrase in &phrases {
            named.extend(std::iter::repeat_n(
                mode,
                text.matches(phrase.as_str()).count(),
            ));
        }
    }
    named
}

#[test]
fn every_page_names_the_default_mode_the_binary_runs() {
    let default = binary_default();
    assert!(MODES.contains(&default.as_str()), "{default}");
    for page in PAGES {
        let named = defaults_named(&read_page(page));
        assert!(!named.is_empty(), "{page} names no default dispatch mode");
        for mode in &named {
            assert_eq!(
                *mode, default,
                "{page} calls `{mode}` the default dispatch mode; the binary runs `{default}`"
            );
        }
    }
}

#[test]
fn readme_lists_every_mode_and_workers_md_has_a_row_for_each() {
    let readme = read_page("README.md");
    let list = readme
        .split("`--dispatch ")
        .find(|rest| rest.starts_with("kernel|") || rest.starts_with("handoff|"))
        .and_then(|rest| rest.split('`').next())
        .expect("README lists --dispatch modes");
    let listed: Vec<&str> = list.split('|').collect();
    for mode in MODES {
        assert!(
            listed.contains(&mode),
            "README's --dispatch {list} leaves out {mode}"
        );
    }
    let workers = read_page("docs/workers.md");
    let table = workers
        .split("## Choosing a dispatch mode")
        .nth(1)
        .expect("workers.md has a mode table");
    for mode in MODES {
        assert!(
            table.contains(&format!("| `{mode}` ")),
            "workers.md's mode table has no row for {mode}"
        );
    }
}
