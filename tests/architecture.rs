//! The house's floors hold: every module of `src/` (a file at the top, or a
//! folder) sits on a floor, and may use only modules on lower floors, never
//! one beside or above it. So no circle of imports spans two modules, and
//! nothing low (raft, the partition leader) reaches up into the admin
//! server or the gateway. Inside the gateway the same holds between its
//! layers (the call layer, the job API, the adapters), and the adapters name
//! nothing of what lies under the job API. Inside every folder, no two files
//! import each other round a circle (but the few listed, with why). The map
//! is in docs/architecture.md; this test is what keeps it true. It also holds
//! source files to a size one reader can take in, unless one thing owns them
//! all (listed below, with why).

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
    // Reaching partition leaders from any node: the gateway, the cluster
    // service and the node's loops all send through it.
    &["leaders"],
    &["gateway", "outbox"],
    &["admin", "cluster"],
    &["node"],
    &["bench", "backup"],
    &["cli"],
];

/// The gateway's own floors, lowest first: the call layer and the request
/// counter, then the job API, then the adapters over it.
const GATEWAY_FLOORS: &[&[&str]] = &[&["call", "observe"], &["api"], &["v1", "zeebe", "ojs"]];

/// Adapters: they translate a protocol and call the job API. Of the gateway
/// they may name only [`ADAPTER_MAY_NAME`]; of the rest of the house nothing
/// that lies under the job API ([`UNDER_THE_JOB_API`]).
const ADAPTERS: &[&str] = &["src/gateway/v1", "src/gateway/zeebe", "src/gateway/ojs", "src/admin/console"];
/// Other users of the gateway name only [`ADAPTER_MAY_NAME`] of it too: the
/// admin port's own views (the actuator, which also reads this node's
/// replicas and store, as diagnostics of the node), the cluster service and
/// the CLI. (The node names the services it serves.)
const GATEWAY_CLIENTS: &[&str] = &["src/admin", "src/cluster", "src/cli"];
const ADAPTER_MAY_NAME: &[&str] = &["api", "call"];
const UNDER_THE_JOB_API: &[&str] = &["leaders", "partition", "raft", "storage", "transport"];

/// Circles of files inside one folder that are left standing, and why.
const CIRCLES_KEPT: &[(&str, &[&str], &str)] = &[
    (
        "src/storage",
        &["mark", "writer"],
        "the group-commit writer and the sync marks it advances are one mechanism split for reading: the mark \
         stops the writer on a failed sync, the writer moves the mark",
    ),
    (
        "src/streams",
        &["aggregator", "flow"],
        "both ends of one flow-control protocol: the aggregator actor holds the credits, and the credits hold \
         the aggregator's address to wake it",
    ),
];

/// Files over the size limit that own one thing, and why that is so.
const LONG_BUT_ONE_THING: &[(&str, &str)] = &[
    ("src/core/tests.rs", "the engine's unit tests, one scenario each"),
    ("src/raft/state_machine/tests.rs", "the state machine's unit tests, one scenario each"),
    ("src/config/mod.rs", "the clap flags of `drover serve`, one per setting, and their resolution into one config"),
    ("src/core/command.rs", "the vocabulary of the log: every command, its answer and its encoded size"),
    ("src/storage/mod.rs", "the RocksDB store: tables, keys, batches, iteration (opening it is apart)"),
    ("src/client/worker.rs", "the Rust worker library's one loop: streams, polls, credits, beats and answers"),
    ("src/partition/leader/mod.rs", "the PartitionLeader actor: its messages and their handling"),
];

/// Lines a source file may have before it must say why it owns one thing.
const MAX_LINES: usize = 600;

fn floor_of(floors: &[&[&str]], module: &str) -> Option<usize> {
    floors.iter().position(|floor| floor.contains(&module))
}

/// The top-level module a file of `src/` belongs to (`src/gateway/api/jobs.rs`
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

/// The paths `code` names through `prefix` (`crate::` in the library,
/// `drover::` in the binary, `super::` inside a folder), each as its
/// segments up to the first that is not a plain name.
fn paths(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let mut segments = Vec::new();
        let mut tail = rest;
        loop {
            let name: String = tail.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if name.is_empty() {
                // `use super::{a, b}`: each name in the group.
                if segments.is_empty() && tail.starts_with('{') {
                    let group = &tail[1..tail.find('}').unwrap_or(tail.len())];
                    for item in group.split(',') {
                        let first: String =
                            item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        if !first.is_empty() && first != "self" {
                            found.push(vec![first]);
                        }
                    }
                }
                break;
            }
            tail = &tail[name.len()..];
            segments.push(name);
            match tail.strip_prefix("::") {
                Some(next) => tail = next,
                None => break,
            }
        }
        if !segments.is_empty() {
            found.push(segments);
        }
    }
    found
}

/// The top-level modules `code` names through `prefix`.
fn named(code: &str, prefix: &str) -> BTreeSet<String> {
    paths(code, prefix).into_iter().map(|p| p[0].clone()).collect()
}

fn source_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files
        .into_iter()
        .map(|file| {
            let relative = file.strip_prefix(root).unwrap().to_string_lossy().to_string();
            (relative, code_of(&std::fs::read_to_string(&file).unwrap()))
        })
        .collect()
}

/// Every (module, module it names) of `src/`, with a file that does it.
fn imports() -> BTreeMap<(String, String), String> {
    let mut edges = BTreeMap::new();
    for (relative, code) in source_files() {
        let Some(module) = module_of(Path::new(relative.strip_prefix("src/").unwrap())) else { continue };
        let prefix = if module == "cli" { "drover::" } else { "crate::" };
        for target in named(&code, prefix) {
            if target != module {
                edges.entry((module.clone(), target)).or_insert_with(|| relative.clone());
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
        match (floor_of(FLOORS, from), floor_of(FLOORS, to)) {
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

/// The gateway part (`api`, `v1`, ...) a file of `src/gateway/` is in.
fn gateway_part(relative: &str) -> Option<String> {
    let rest = relative.strip_prefix("src/gateway/")?;
    let first = rest.split('/').next()?;
    (first != "mod.rs").then(|| first.trim_end_matches(".rs").to_string())
}

/// The gateway parts `code` names, whether as `crate::gateway::x` or (from
/// a part's top file) `super::x`.
fn gateway_parts_named(relative: &str, code: &str) -> BTreeSet<String> {
    let mut parts: BTreeSet<String> =
        paths(code, "crate::").into_iter().filter(|p| p[0] == "gateway" && p.len() > 1).map(|p| p[1].clone()).collect();
    // `super::` from a part's top file (`gateway/v1/mod.rs`, `gateway/call.rs`) names its siblings.
    let at_top =
        relative.matches('/').count() == 2 || relative.ends_with("/mod.rs") && relative.matches('/').count() == 3;
    if at_top {
        parts.extend(paths(code, "super::").into_iter().map(|p| p[0].clone()));
    }
    parts
}

#[test]
fn inside_the_gateway_adapters_sit_on_the_job_api_which_sits_on_the_call_layer() {
    let mut wrong = Vec::new();
    let mut seen = 0;
    for (relative, code) in source_files() {
        let Some(part) = gateway_part(&relative) else { continue };
        let Some(from) = floor_of(GATEWAY_FLOORS, &part) else {
            wrong.push(format!("{relative}: gateway part {part} is on no floor: add it to GATEWAY_FLOORS"));
            continue;
        };
        for target in gateway_parts_named(&relative, &code) {
            seen += 1;
            match floor_of(GATEWAY_FLOORS, &target) {
                Some(to) if target != part && to >= from => wrong.push(format!(
                    "{relative}: gateway::{part} (floor {from}) uses gateway::{target} (floor {to}), not below it"
                )),
                _ => {}
            }
        }
    }
    assert!(seen > 5, "the walk found only {seen} uses inside the gateway");
    assert!(wrong.is_empty(), "imports that break the gateway's floors:\n{}", wrong.join("\n"));
}

#[test]
fn adapters_name_only_the_job_api_and_the_call_layer() {
    let mut wrong = Vec::new();
    let mut adapters = 0;
    let within = |relative: &str, places: &[&str]| {
        places.iter().any(|a| relative.starts_with(&format!("{a}/")) || relative == format!("{a}.rs"))
    };
    for (relative, code) in source_files() {
        let adapter = within(&relative, ADAPTERS);
        if !adapter && !within(&relative, GATEWAY_CLIENTS) {
            continue;
        }
        adapters += usize::from(adapter);
        let prefix = if relative.starts_with("src/cli/") || relative == "src/main.rs" { "drover::" } else { "crate::" };
        for path in paths(&code, prefix) {
            match path[0].as_str() {
                "gateway" if path.len() > 1 && !ADAPTER_MAY_NAME.contains(&path[1].as_str()) => {
                    // An adapter names its own folder's files through `crate::gateway::<itself>` at most.
                    let own = relative.strip_prefix("src/gateway/").and_then(|r| r.split('/').next());
                    if own != Some(path[1].as_str()) {
                        wrong.push(format!("{relative}: names crate::gateway::{}", path[1..].join("::")))
                    }
                }
                "gateway" if path.len() == 1 => wrong.push(format!("{relative}: names crate::gateway itself")),
                under if adapter && UNDER_THE_JOB_API.contains(&under) => {
                    wrong.push(format!("{relative}: names crate::{}, under the job API", path.join("::")))
                }
                _ => {}
            }
        }
    }
    assert!(adapters > 20, "found only {adapters} adapter files");
    assert!(wrong.is_empty(), "adapters that reach past the job API:\n{}", wrong.join("\n"));
}

/// The files and folders directly inside each folder of `src/`, and which
/// of its siblings each names: `super::x` from a file beside `x`, or
/// `crate::<path to the folder>::x`.
fn sibling_uses() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut folders: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let files = source_files();
    let children: BTreeSet<(String, String)> = files
        .iter()
        .filter_map(|(relative, _)| {
            let (folder, name) = relative.rsplit_once('/')?;
            let name = name.trim_end_matches(".rs");
            Some(match name {
                "mod" => {
                    let (parent, own) = folder.rsplit_once('/')?;
                    (parent.to_string(), own.to_string())
                }
                _ => (folder.to_string(), name.to_string()),
            })
        })
        .collect();
    for (relative, code) in &files {
        let (mut folder, name) = relative.rsplit_once('/').unwrap();
        let mut name = name.trim_end_matches(".rs");
        if folder == "src" && (name == "lib" || name == "main") {
            continue;
        }
        // A folder's mod.rs speaks for the folder, beside its siblings (its
        // `super::` is the parent's).
        if name == "mod" {
            (folder, name) = folder.rsplit_once('/').unwrap();
        }
        // Every folder on the way down, and the child of it this file is in.
        let mut chain = Vec::new();
        let mut path = folder.to_string();
        let mut child = name.to_string();
        loop {
            chain.push((path.clone(), child.clone()));
            match path.rsplit_once('/') {
                Some((parent, own)) => {
                    child = own.to_string();
                    path = parent.to_string();
                }
                None => break,
            }
        }
        for (at, (folder, child)) in chain.into_iter().enumerate() {
            let chain_start = at == 0;
            let module = folder.strip_prefix("src").unwrap_or(&folder).trim_start_matches('/').replace('/', "::");
            let mut named = BTreeSet::new();
            if chain_start {
                named.extend(paths(code, "super::").into_iter().map(|p| p[0].clone()));
            }
            let prefix = if module.is_empty() { "crate::".to_string() } else { format!("crate::{module}::") };
            named.extend(paths(code, &prefix).into_iter().map(|p| p[0].clone()));
            let uses = folders.entry(folder.clone()).or_default().entry(child.clone()).or_default();
            for target in named {
                if target != child && children.contains(&(folder.clone(), target.clone())) {
                    uses.insert(target);
                }
            }
        }
    }
    folders
}

/// The circles (strongly connected sets of two or more) of a graph.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(node) = todo.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> = graph.keys().map(|k| (k, reach(k))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for (node, from_it) in &reached {
        let circle: Vec<String> = std::iter::once((*node).clone())
            .chain(from_it.iter().filter(|other| reached.get(other).is_some_and(|r| r.contains(*node))).cloned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if circle.len() > 1 && !out.contains(&circle) {
            out.push(circle);
        }
    }
    out
}

#[test]
fn no_files_of_one_folder_import_each_other_round_a_circle() {
    let mut found = Vec::new();
    let folders = sibling_uses();
    assert!(folders.len() > 20, "the walk found only {} folders", folders.len());
    for (folder, graph) in &folders {
        for circle in circles(graph) {
            let kept = CIRCLES_KEPT.iter().any(|(f, files, _)| f == folder && files.iter().eq(circle.iter()));
            if !kept {
                found.push(format!("{folder}: {}", circle.join(" <-> ")));
            }
        }
    }
    assert!(
        found.is_empty(),
        "circles of imports inside a folder (break them, or say in CIRCLES_KEPT why not):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checks_find_what_they_look_for() {
    // The floor check: an import from raft into the admin server is caught.
    let code = code_of("use crate::admin::stages; // crate::gateway in a comment\nfn f() { crate::core::x(); }");
    let named = named(&code, "crate::");
    assert_eq!(named, BTreeSet::from(["admin".to_string(), "core".to_string()]));
    assert!(floor_of(FLOORS, "admin") > floor_of(FLOORS, "raft"), "raft naming admin climbs");
    assert!(floor_of(FLOORS, "core") < floor_of(FLOORS, "raft"));
    assert_eq!(module_of(Path::new("gateway/api/jobs.rs")).as_deref(), Some("gateway"));
    assert_eq!(module_of(Path::new("main.rs")).as_deref(), Some("cli"));
    // Paths, groups and a gateway part.
    assert_eq!(paths("use super::{a, b::c, self};", "super::"), vec![vec!["a".to_string()], vec!["b".to_string()]]);
    assert_eq!(paths("crate::gateway::api::JobApi::new()", "crate::")[0], ["gateway", "api", "JobApi", "new"]);
    assert_eq!(gateway_part("src/gateway/ojs/worker.rs").as_deref(), Some("ojs"));
    assert_eq!(gateway_part("src/gateway/call.rs").as_deref(), Some("call"));
    assert!(floor_of(GATEWAY_FLOORS, "api") < floor_of(GATEWAY_FLOORS, "ojs"));
    // A circle of three, and a line that is not one.
    let graph: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .map(|(from, to)| (from.to_string(), BTreeSet::from([to.to_string()])))
        .collect();
    assert_eq!(circles(&graph), vec![vec!["a".to_string(), "b".to_string(), "c".to_string()]]);
}

#[test]
fn no_source_file_is_longer_than_one_reader_takes_in_unless_it_owns_one_thing() {
    let mut long = Vec::new();
    for (relative, _) in source_files() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let lines = std::fs::read_to_string(root.join(&relative)).unwrap().lines().count();
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
