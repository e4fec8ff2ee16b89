//! README.md's map ("Where things are") names every file and folder of
//! the library, so a newcomer finds from it alone where a connection goes,
//! who decides how many children there are, and how a worker is born: a
//! file added without a line there fails this test.

use std::path::{Path, PathBuf};

/// The map: README.md's "Where things are" section.
fn map() -> String {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let text = std::fs::read_to_string(&readme).expect("README.md");
    let start = text
        .find("## Where things are")
        .expect("README.md has a \"Where things are\" section");
    let rest = &text[start + 2..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    rest[..end].to_string()
}

/// Whether `name` stands in `text` as a word of its own (not inside a
/// longer name: `rollout.rs` in `sim/reloads.rs` does not count).
fn names(text: &str, name: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + name.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

/// Every file and folder under `dir`, as paths relative to `root`.
fn walk(root: &Path, dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let path = entry.expect("an entry").path();
        found.push(path.strip_prefix(root).expect("under src").to_path_buf());
        if path.is_dir() {
            walk(root, &path, found);
        }
    }
}

#[test]
fn the_readme_map_names_every_file_of_the_library() {
    let map = map();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    walk(&src, &src, &mut found);
    let missing: Vec<String> = found
        .iter()
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?;
            let wanted = if src.join(path).is_dir() {
                format!("{name}/")
            } else if matches!(name, "mod.rs" | "lib.rs") || !name.ends_with(".rs") {
                return None;
            } else {
                name.to_string()
            };
            (!names(&map, &wanted)).then(|| path.display().to_string())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "README.md's map (\"Where things are\") does not name: {missing:?}; add a line for each"
    );
}

#[test]
fn a_name_counts_only_as_a_word_of_its_own() {
    assert!(names("  kernel.rs   the kernel", "kernel.rs"));
    assert!(names("reload.rs, rollout.rs  HUP", "rollout.rs"));
    assert!(!names("sim/reloads.rs", "loads.rs"));
    assert!(!names("my_kernel.rs", "kernel.rs"));
}
