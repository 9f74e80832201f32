//! The suite: every nemesis alone, the bad links on two regions, all
//! combined, and the negative controls (see `controls`), one run after
//! another, with one line per failed run at the end.

use std::time::Instant;

use crate::SUITE_DISK_BYTES;
use crate::{check_free_space, checker, controls, remove_node_data, stop_signal, Nemesis, RunArgs, SuiteArgs};

/// The suite: with `real`, every nemesis alone, the bad links on two
/// regions and all combined; with `controls`, the negative controls. Each
/// real run must be VALID or UNKNOWN (said why); each control must be
/// caught. Answers the exit code: 0 when all are, 1 otherwise.
pub fn run(suite: SuiteArgs, real: bool, with_controls: bool) -> anyhow::Result<i32> {
    let SuiteArgs { run: args, combined_time, combined_nodes, skip_secure, keep_data, control_time, .. } = suite;
    check_free_space(&args.out, SUITE_DISK_BYTES)?;
    let started = Instant::now();
    let (mut passed, mut unknown) = (0, 0);
    // The failed runs' summaries, repeated at the end: a CI log is often
    // read from its tail.
    let mut failed: Vec<String> = Vec::new();
    let mut runs: Vec<(RunArgs, Option<&controls::Control>)> = Vec::new();
    if real {
        // Every nemesis alone, with tokens on (so with the attacker of
        // `attacker`) unless --skip-secure, and all of them combined with
        // TLS on every port and tokens.
        let secure = (args.tls, args.tokens || !skip_secure);
        let mut combos: Vec<(Vec<Nemesis>, (bool, bool), bool)> =
            Nemesis::ALL.iter().map(|n| (vec![*n], secure, false)).collect();
        // The bad links again on two regions of 5 nodes, 40 ms apart.
        combos.push((vec![Nemesis::Badlinks], secure, true));
        // One combined run: with TLS and tokens unless --skip-secure.
        combos.push((Nemesis::ALL.to_vec(), if skip_secure { secure } else { (true, true) }, false));
        for (nemesis, (tls, tokens), regions) in combos {
            let combined = nemesis.len() > 1;
            let mut args = RunArgs { nemesis, tls, tokens, regions, ..args.clone() };
            if combined {
                args.time = combined_time.unwrap_or(args.time);
                args.nodes = combined_nodes.unwrap_or(args.nodes);
            }
            if regions {
                args.nodes = 5;
            }
            runs.push((args, None));
        }
    }
    if with_controls {
        for control in &controls::CONTROLS {
            let args = RunArgs {
                nemesis: control.nemesis.to_vec(),
                tls: false,
                tokens: control.tokens,
                regions: false,
                skip_wal_sync: control.skip_wal_sync,
                failpoints: (!control.failpoints.is_empty()).then(|| control.failpoints.to_string()),
                control: Some(control.name.to_string()),
                time: control_time.unwrap_or(args.time),
                drain: args.drain.min(controls::DRAIN_SECS),
                ..args.clone()
            };
            runs.push((args, Some(control)));
        }
    }
    for (mut args, control) in runs {
        // The seed is drawn here, so that a failure can be named by it.
        let seed = args.seed.unwrap_or_else(rand::random);
        args.seed = Some(seed);
        let label = format!("{} seed {seed}", args.names().join("+"));
        let outcome = crate::run(args);
        if stop_signal() != 0 {
            println!("jepsen: stopped by signal {} after {label}", stop_signal());
            return Ok(1);
        }
        let (verdict, dir) = match outcome {
            Ok(done) => done,
            Err(e) => {
                eprintln!("jepsen: run failed: {e:#}");
                failed.push(format!("{label}: {e:#}"));
                continue;
            }
        };
        let report = std::fs::read_to_string(dir.join("report.txt")).unwrap_or_default();
        let first: Vec<&str> = report.lines().take(12).collect();
        let ok = match control {
            None => verdict != checker::Verdict::Invalid,
            Some(control) => {
                let kept: Option<controls::Outcome> =
                    std::fs::read_to_string(dir.join("verdict.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
                let (caught, found) = kept.map_or((false, Vec::new()), |o| control.caught(&o));
                let found = if found.is_empty() { "nothing".to_string() } else { found.join(", ") };
                println!(
                    "jepsen: control {}: {} ({}; must be found as {}): {verdict}, found {found}",
                    control.name,
                    if caught { "caught" } else { "NOT CAUGHT" },
                    control.plants,
                    control.caught_by.join(" or ")
                );
                caught
            }
        };
        match (ok, verdict) {
            (true, checker::Verdict::Unknown) if control.is_none() => unknown += 1,
            (true, _) => passed += 1,
            (false, _) => failed.push(format!("{label} ({})\n  {}", dir.display(), first.join("\n  "))),
        }
        // A run that passed keeps its logs, history and report, not its data.
        if ok && !keep_data {
            remove_node_data(&dir);
        }
    }
    println!(
        "jepsen: {passed} passed, {unknown} unknown, {} failed, in {} s",
        failed.len(),
        started.elapsed().as_secs()
    );
    for label in &failed {
        println!("jepsen: failed: {label}");
    }
    Ok(if failed.is_empty() { 0 } else { 1 })
}
