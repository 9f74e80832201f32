//! The house's floors hold: every module of `src/` (a file at the top, or a
//! folder) sits on a floor, and may use only modules on lower floors, never
//! one beside or above it. So no circle of imports spans two modules, and
//! nothing low (raft, the partition leader) reaches up into the admin
//! server or the gateway. The map is in docs/architecture.md; this test is
//! what keeps it true. It also holds source files to a size one reader can
//! take in, unless one thing owns them all (listed below, with why).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Floors, lowest first. A module may name modules of lower floors only.
const FLOORS: &[&[&str]] = &[
    // Where replicas go: pure, and the engine's cluster plan places by it.
    &["placement"],
    // The ground: the pure engine, the generated contracts, and pieces that import nothing of Drover's.
    &["core", "proto", "failpoints", "tasks", "codec", "calendar"],
    &["trace_context", "metrics", "tls", "memory"],
    &["client", "telemetry", "storage", "auth", "transport"],
    &["raft"],
    &["config", "streams"],
    &["partition"],
    &["context"],
    &["gateway", "outbox"],
    &["admin", "cluster"],
    &["node"],
    &["bench", "backup"],
    &["cli"],
];

/// Files over the size limit that own one thing, and why that is so.
const LONG_BUT_ONE_THING: &[(&str, &str)] = &[("src/core/tests.rs", "the engine's unit tests, one scenario each")];

/// Lines a source file may have before it must say why it owns one thing.
const MAX_LINES: usize = 700;

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|floor| floor.contains(&module))
}

/// The top-level module a file of `src/` belongs to (`src/gateway/jobs.rs`
/// is `gateway`; `src/main.rs` is the CLI's).
fn module_of(relative: &Path) -> Option<String> {
    let mut parts = relative.components().map(|c| c.as_os_str().to_string_lossy().to_string());
    let first = parts.next()?;
    match (first.as_str(), relative.components().count()) {
        ("lib.rs", 1) => None,
        ("main.rs", 1) => Some("cli".into()),
        (file, 1) => Some(file.trim_end_matches(".rs").to_string()),
        (folder, _) => Some(folder.to_string()),
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments (doc comments name modules in
/// links; only code is an import).
fn code_of(text: &str) -> String {
    text.lines().map(|line| line.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The top-level modules `code` names through `prefix` (`crate::` in the
/// library, `drover::` in the binary).
fn named(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if !name.is_empty() {
            found.insert(name);
        }
    }
    found
}

/// Every (module, module it names) of `src/`, with a file that does it.
fn imports() -> BTreeMap<(String, String), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut edges = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&root).unwrap().to_path_buf();
        let Some(module) = module_of(&relative) else { continue };
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        let prefix = if module == "cli" { "drover::" } else { "crate::" };
        for target in named(&code, prefix) {
            if target != module {
                edges.entry((module.clone(), target)).or_insert_with(|| format!("src/{}", relative.display()));
            }
        }
    }
    edges
}

#[test]
fn every_module_uses_only_modules_on_lower_floors() {
    let edges = imports();
    assert!(edges.len() > 50, "the walk found {} imports between modules; it reads src/", edges.len());
    let mut wrong = Vec::new();
    for ((from, to), file) in &edges {
        match (floor_of(from), floor_of(to)) {
            (None, _) => wrong.push(format!("{from} ({file}) is on no floor: add it to FLOORS")),
            (_, None) => wrong.push(format!("{to} (named in {file}) is on no floor: add it to FLOORS")),
            (Some(a), Some(b)) if b >= a => {
                wrong.push(format!("{file}: {from} (floor {a}) uses {to} (floor {b}), a floor not below it"))
            }
            _ => {}
        }
    }
    assert!(wrong.is_empty(), "imports that break the floors:\n{}", wrong.join("\n"));
}

#[test]
fn the_floor_check_finds_a_use_that_climbs() {
    // The checker itself: an import from raft into the admin server is caught.
    let code = code_of("use crate::admin::stages; // crate::gateway in a comment\nfn f() { crate::core::x(); }");
    let named = named(&code, "crate::");
    assert_eq!(named, BTreeSet::from(["admin".to_string(), "core".to_string()]));
    assert!(floor_of("admin") > floor_of("raft"), "raft naming admin climbs");
    assert!(floor_of("core") < floor_of("raft"));
    assert_eq!(module_of(Path::new("gateway/jobs.rs")).as_deref(), Some("gateway"));
    assert_eq!(module_of(Path::new("main.rs")).as_deref(), Some("cli"));
}

#[test]
fn no_source_file_is_longer_than_one_reader_takes_in_unless_it_owns_one_thing() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut long = Vec::new();
    for file in files {
        let relative = file.strip_prefix(root).unwrap().to_string_lossy().to_string();
        let lines = std::fs::read_to_string(&file).unwrap().lines().count();
        if lines > MAX_LINES && !LONG_BUT_ONE_THING.iter().any(|(f, _)| *f == relative) {
            long.push(format!("{relative}: {lines} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines (split them, or say in LONG_BUT_ONE_THING why not):\n{}",
        long.join("\n")
    );
}
