//! Fuzz targets for every decoder that reads bytes from outside the node:
//! client requests (decoded as tonic would, then answered by the real
//! services of a running node), cluster messages (forwarded commands, Raft
//! entries applied to the engine, Raft RPCs, peers' replies), stored
//! records, snapshot streams, and configuration files (the node's TOML, the
//! tokens file, the JWKS, bearer tokens).
//!
//! The engine is a seeded mutation driver on stable Rust: each target starts
//! from its corpus in `fuzz/corpus/<target>/` (valid encodings, plus every
//! input that once crashed a target, kept as a regression), then mutates
//! corpus entries (bit flips, interesting integers, inserted, deleted and
//! duplicated ranges, splices, truncation) for a bounded time. An input fails
//! a target if it panics, or if a decoded value does not survive its own
//! encoding, or if a service answers it with UNKNOWN or INTERNAL. A failure
//! writes the input to `$CARGO_TARGET_TMPDIR/fuzz-failures/` and names it.
//!
//! `DROVER_FUZZ_SECONDS` sets each target's time (default 4; the gRPC target
//! gets five times that), `DROVER_FUZZ_SEED` the seed (default: fixed, so CI
//! runs the same inputs), and `DROVER_FUZZ_WRITE_CORPUS=1` rewrites the seed
//! files of the corpus from the code below.

mod common;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use drover::core::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn budget() -> Duration {
    let seconds = std::env::var("DROVER_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4.0);
    Duration::from_secs_f64(seconds)
}

fn seed() -> u64 {
    std::env::var("DROVER_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_d20e)
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target)
}

/// The target's corpus: its files, after (re)writing `seeds` into it when
/// asked. Seeds are written only then, so the corpus in the repository is
/// what every run starts from.
fn corpus(target: &str, seeds: Vec<(String, Vec<u8>)>) -> Vec<Vec<u8>> {
    let dir = corpus_dir(target);
    if std::env::var_os("DROVER_FUZZ_WRITE_CORPUS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in &seeds {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!("the corpus {} is missing ({e}); DROVER_FUZZ_WRITE_CORPUS=1 writes it", dir.display())
        })
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the corpus {} is empty", dir.display());
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

/// Mutations of corpus entries.
struct Mutator {
    rng: StdRng,
}

const INTERESTING: [u64; 12] =
    [0, 1, 0x7f, 0x80, 0xff, 0x7fff, 0xffff, 0x7fff_ffff, 0xffff_ffff, 1 << 32, i64::MAX as u64, u64::MAX];

impl Mutator {
    fn mutate(&mut self, corpus: &[Vec<u8>]) -> Vec<u8> {
        let mut input = corpus[self.rng.random_range(0..corpus.len())].clone();
        for _ in 0..self.rng.random_range(1..=4) {
            let len = input.len();
            match self.rng.random_range(0..9) {
                0 if len > 0 => {
                    let at = self.rng.random_range(0..len);
                    input[at] ^= 1 << self.rng.random_range(0..8);
                }
                1 if len > 0 => {
                    let at = self.rng.random_range(0..len);
                    input[at] = self.rng.random();
                }
                2 if len > 0 => {
                    // An interesting integer over 1, 2, 4 or 8 bytes: lengths and counts.
                    let width = [1, 2, 4, 8][self.rng.random_range(0..4)];
                    let at = self.rng.random_range(0..len);
                    let value = INTERESTING[self.rng.random_range(0..INTERESTING.len())].to_le_bytes();
                    for (i, b) in value.iter().take(width).enumerate() {
                        if at + i < len {
                            input[at + i] = *b;
                        }
                    }
                }
                3 => {
                    let at = self.rng.random_range(0..=len);
                    let bytes: Vec<u8> = (0..self.rng.random_range(1..16)).map(|_| self.rng.random()).collect();
                    input.splice(at..at, bytes);
                }
                4 if len > 0 => {
                    let from = self.rng.random_range(0..len);
                    let to = (from + self.rng.random_range(1..=16)).min(len);
                    input.drain(from..to);
                }
                5 if len > 0 => {
                    let from = self.rng.random_range(0..len);
                    let to = (from + self.rng.random_range(1..=32)).min(len);
                    let copy = input[from..to].to_vec();
                    let at = self.rng.random_range(0..=len);
                    input.splice(at..at, copy);
                }
                6 => {
                    let other = &corpus[self.rng.random_range(0..corpus.len())];
                    let cut = self.rng.random_range(0..=input.len());
                    let from = self.rng.random_range(0..=other.len());
                    input.truncate(cut);
                    input.extend_from_slice(&other[from..]);
                }
                7 if len > 0 => input.truncate(self.rng.random_range(0..len)),
                _ => {}
            }
        }
        input
    }
}

/// What a target did, for the log (and the closing figures).
struct Report {
    target: &'static str,
    executions: u64,
    elapsed: Duration,
    corpus: usize,
}

impl Report {
    fn print(&self) {
        println!(
            "fuzz {}: {} executions in {:.1} s ({:.0}/s) from a corpus of {}, no failures",
            self.target,
            self.executions,
            self.elapsed.as_secs_f64(),
            self.executions as f64 / self.elapsed.as_secs_f64().max(1e-9),
            self.corpus
        );
    }
}

fn failed(target: &str, input: &[u8], why: &str) -> ! {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    let name = format!(
        "{:016x}",
        input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3))
    );
    let path = dir.join(&name);
    std::fs::write(&path, input).unwrap();
    let hex: String = input.iter().take(256).map(|b| format!("{b:02x}")).collect();
    panic!(
        "fuzz target {target} failed: {why}\ninput ({} bytes) saved as {}\n(copy it into fuzz/corpus/{target}/ as a regression once fixed)\nhex: {hex}",
        input.len(),
        path.display()
    );
}

/// Runs `check` on every corpus entry, then on mutations until the budget
/// is spent. `check` returns an error for an input that decoded to
/// something wrong; a panic is a failure too.
fn fuzz(
    target: &'static str,
    seeds: Vec<(String, Vec<u8>)>,
    time: Duration,
    check: impl Fn(&[u8]) -> Result<(), String>,
) -> Report {
    let corpus = corpus(target, seeds);
    let started = Instant::now();
    let run = |input: &[u8]| match catch_unwind(AssertUnwindSafe(|| check(input))) {
        Ok(Ok(())) => {}
        Ok(Err(why)) => failed(target, input, &why),
        Err(panic) => {
            let message =
                panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
            failed(target, input, &format!("panicked: {}", message.unwrap_or_default()))
        }
    };
    let mut executions = 0;
    for input in &corpus {
        run(input);
        executions += 1;
    }
    let mut mutator = Mutator { rng: StdRng::seed_from_u64(seed() ^ fnv(target)) };
    while started.elapsed() < time {
        for _ in 0..64 {
            run(&mutator.mutate(&corpus));
            executions += 1;
        }
    }
    let report = Report { target, executions, elapsed: started.elapsed(), corpus: corpus.len() };
    report.print();
    report
}

fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// A decoded value must encode back to bytes that decode to the same value.
fn round_trip<T>(value: &T) -> Result<(), String>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let again: T = bincode::deserialize(&bincode::serialize(value).map_err(|e| e.to_string())?)
        .map_err(|e| format!("a decoded value does not decode again: {e}"))?;
    if &again != value {
        return Err(format!("a decoded value changed through its encoding: {value:?} then {again:?}"));
    }
    Ok(())
}

/// An engine with jobs in every state a command can meet, and the batches
/// that made it.
fn engine() -> (PartitionState, Vec<Batch>) {
    let mut state = PartitionState::new(0);
    let spec = |job_type: &str, stages: bool| {
        Arc::new(JobSpec {
            job_type: job_type.into(),
            variables: r#"{"n":1}"#.into(),
            stages: if stages { vec!["charged".into(), "notified".into()] } else { Vec::new() },
            ..Default::default()
        })
    };
    let create = |job_type: &str, retries: i32, request: Option<RequestId>| {
        Command::Create(NewJob {
            spec: spec(job_type, request.is_some()),
            retries,
            run_at: None,
            delay_ms: 0,
            request,
            dedupe_window_ms: 60_000,
        })
    };
    let keyed = RequestId::Key { tenant: DEFAULT_TENANT.into(), user: String::new(), key: "order-1".into() };
    let activation = |job_type: &str| {
        Command::Activate(Activation {
            job_type: job_type.into(),
            tenants: vec![DEFAULT_TENANT.into()],
            worker: "w".into(),
            timeout_ms: 30_000,
            max_jobs: 2,
            max_bytes: u64::MAX,
            session: 0,
            via: Via::Unknown,
            taker: Default::default(),
            rivals: Vec::new(),
        })
    };
    let k = |n| JobKey::new(0, n);
    let batches = vec![
        Batch::at(
            1_000,
            vec![create("a", 3, None), create("a", 0, None), create("b", 2, Some(keyed)), create("c", 1, None)],
        ),
        Batch::at(1_100, vec![activation("a"), activation("b")]),
        Batch::at(
            1_200,
            vec![
                Command::Fail {
                    key: k(2),
                    attempt: 1,
                    retries: 0,
                    error_message: "declined".into(),
                    back_off_ms: 0,
                    variables: Bytes::new(),
                    max_payload_bytes: 1 << 20,
                    reason: FailReason::Failed,
                },
                Command::Checkpoint {
                    key: k(3),
                    attempt: 1,
                    stage: "charged".into(),
                    variables: Bytes::from_static(b"{\"c\":1}"),
                    max_payload_bytes: 1 << 20,
                },
                Command::UpdateTimeout { key: k(1), attempt: 1, timeout_ms: 60_000 },
            ],
        ),
        Batch::at(
            1_250,
            vec![Command::Yield { key: k(1), attempt: 1, gateway: 2, reason: YieldReason::NotReady }, activation("a")],
        ),
        Batch::at(
            1_300,
            vec![
                Command::Complete { key: k(3), attempt: 1, variables: Bytes::from_static(b"{\"done\":true}") },
                Command::UpdateRetries { key: k(2), retries: 1, by: "ops".into() },
                Command::Cancel { key: k(4), by: "ops".into() },
            ],
        ),
    ];
    for batch in &batches {
        state.apply(batch);
    }
    (state, batches)
}

#[test]
fn stored_records() {
    let (state, _) = engine();
    let seeds = state.jobs().map(|job| (format!("job-{}", job.key.0), bincode::serialize(job).unwrap())).collect();
    fuzz("stored_job", seeds, budget(), |bytes| match drover::storage::decode::<Job>("job", bytes) {
        Ok(job) => round_trip(&job),
        Err(_) => Ok(()),
    });
}

#[test]
fn snapshot_streams() {
    let (state, _) = engine();
    let finished: Vec<Job> = state.jobs().filter(|j| j.state.is_final()).cloned().collect();
    let seeds = vec![
        ("empty".to_string(), drover::raft::snapshot_bytes(&PartitionState::new(0), &[])),
        ("jobs".to_string(), drover::raft::snapshot_bytes(&state, &[])),
        ("jobs-and-final-records".to_string(), drover::raft::snapshot_bytes(&state, &finished)),
    ];
    fuzz("snapshot", seeds, budget(), |bytes| {
        let _ = drover::raft::check_snapshot(bytes);
        Ok(())
    });
}

/// The crash the snapshot target found: a length prefix claiming 2^60 bytes
/// made a node installing the snapshot allocate that much and abort. Kept as
/// a regression for every length a snapshot holds, not only the one found:
/// each 8-byte window of a valid snapshot in turn claims 2^60 bytes, then
/// each 4-byte window 2^32 - 1 (the largest frame length), and every such
/// snapshot is refused or read without allocating what it claims (an abort
/// would end this test's process).
#[test]
fn no_length_in_a_snapshot_is_trusted() {
    let (state, _) = engine();
    let finished: Vec<Job> = state.jobs().filter(|j| j.state.is_final()).cloned().collect();
    let valid = drover::raft::snapshot_bytes(&state, &finished);
    assert!(drover::raft::check_snapshot(&valid).is_ok(), "the unmutated snapshot reads");
    let mut refused = 0;
    for (width, claim) in [(8, (1u64 << 60).to_le_bytes().to_vec()), (4, u32::MAX.to_le_bytes().to_vec())] {
        for at in 0..=valid.len() - width {
            let mut lying = valid.clone();
            lying[at..at + width].copy_from_slice(&claim);
            refused += usize::from(drover::raft::check_snapshot(&lying).is_err());
        }
    }
    assert!(refused > 0, "some windows are lengths, and those must be refused");
}

/// Raft entries and forwarded commands decode, and whatever decodes is
/// applied to an engine holding jobs in every state: no value a peer can
/// send may panic the state machine.
#[test]
fn cluster_commands_applied_to_the_engine() {
    let (_, batches) = engine();
    let seeds =
        batches.iter().enumerate().map(|(i, b)| (format!("batch-{i}"), bincode::serialize(b).unwrap())).collect();
    fuzz("cluster_batch", seeds, budget(), |bytes| {
        let Ok(batch) = bincode::deserialize::<Batch>(bytes) else { return Ok(()) };
        let (mut state, _) = engine();
        state.apply(&batch);
        // A forwarded batch's commands alone, as the cluster service decodes them.
        let commands = bincode::serialize(&batch.commands).unwrap();
        let decoded: Vec<Command> = bincode::deserialize(&commands).map_err(|e| e.to_string())?;
        if decoded.len() != batch.commands.len() {
            return Err("the commands changed through their encoding".into());
        }
        Ok(())
    });
}

#[test]
fn cluster_messages() {
    use drover::raft::TypeConfig;
    use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
    let (state, batches) = engine();
    let log_id = |term, index| openraft::LogId::new(openraft::CommittedLeaderId::new(term, 0), index);
    let entries: Vec<openraft::Entry<TypeConfig>> = batches
        .iter()
        .enumerate()
        .map(|(i, b)| openraft::Entry {
            log_id: log_id(2, i as u64 + 1),
            payload: openraft::EntryPayload::Normal(b.clone()),
        })
        .collect();
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: openraft::Vote::new_committed(2, 0),
        prev_log_id: Some(log_id(1, 0)),
        entries,
        leader_commit: Some(log_id(2, 2)),
    };
    let vote = VoteRequest::<u64>::new(openraft::Vote::new(3, 1), Some(log_id(2, 4)));
    let snapshot = InstallSnapshotRequest::<TypeConfig> {
        vote: openraft::Vote::new_committed(2, 0),
        meta: Default::default(),
        offset: 0,
        data: drover::raft::snapshot_bytes(&state, &[]),
        done: true,
    };
    let principal = drover::auth::Principal::for_job(JobKey::new(0, 1).0, 1);
    let tag = |kind: u8, bytes: Vec<u8>| [vec![kind], bytes].concat();
    let seeds = vec![
        ("append-entries".to_string(), tag(0, bincode::serialize(&append).unwrap())),
        ("vote".to_string(), tag(1, bincode::serialize(&vote).unwrap())),
        ("install-snapshot".to_string(), tag(2, bincode::serialize(&snapshot).unwrap())),
        ("forward-principal".to_string(), tag(3, bincode::serialize(&principal).unwrap())),
        ("describe-reply".to_string(), tag(4, bincode::serialize(&state.jobs().next().cloned()).unwrap())),
        ("list-reply".to_string(), tag(5, bincode::serialize(&state.jobs().cloned().collect::<Vec<Job>>()).unwrap())),
    ];
    // The first byte picks the message, as each RPC knows what it decodes.
    fuzz("cluster_message", seeds, budget(), |bytes| {
        let Some((kind, rest)) = bytes.split_first() else { return Ok(()) };
        match kind % 6 {
            0 => {
                if let Ok(request) = bincode::deserialize::<AppendEntriesRequest<TypeConfig>>(rest) {
                    let mut state = PartitionState::new(0);
                    for entry in &request.entries {
                        if let openraft::EntryPayload::Normal(batch) = &entry.payload {
                            state.apply(batch);
                        }
                    }
                }
            }
            1 => drop(bincode::deserialize::<VoteRequest<u64>>(rest)),
            2 => {
                if let Ok(request) = bincode::deserialize::<InstallSnapshotRequest<TypeConfig>>(rest) {
                    let _ = drover::raft::check_snapshot(&request.data);
                }
            }
            3 => {
                if let Ok(principal) = bincode::deserialize::<drover::auth::Principal>(rest) {
                    let _ = principal.may(drover::auth::Verb::Work, "a");
                }
            }
            4 => drop(bincode::deserialize::<Option<Job>>(rest)),
            _ => drop(bincode::deserialize::<Vec<Job>>(rest)),
        }
        Ok(())
    });
}

#[test]
fn configuration_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("drover.toml");
    let config = "node_id = 1\nmembers = [\"0=127.0.0.1:26502\", \"1=127.0.0.1:26512\"]\npartitions = 3\n\
                  replication_factor = 2\ndata_dir = \"/var/lib/drover\"\ngrpc_addr = \"0.0.0.0:26500\"\n";
    let seeds = vec![("config".to_string(), config.as_bytes().to_vec())];
    fuzz("config_file", seeds, budget(), |bytes| {
        std::fs::write(&path, bytes).unwrap();
        let args = drover::config::ServeArgs { config: Some(path.clone()), ..Default::default() };
        let _ = args.resolve();
        Ok(())
    });
}

#[test]
fn tokens_jwks_and_bearer_tokens() {
    use drover::auth::keys::{create_token, generate_secret, generate_signing_key, token_entry};
    use drover::auth::{AuthSettings, Authenticator};
    let dir = tempfile::tempdir().unwrap();
    let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let secret = generate_secret();
    let tokens = token_entry("ops", &secret, &strings(&["jobs:*"]), &strings(&["*"]));
    let key = generate_signing_key().unwrap();
    let (tokens_path, jwks_path, job_key) =
        (dir.path().join("tokens.toml"), dir.path().join("jwks.json"), dir.path().join("job-token.key"));
    std::fs::write(&job_key, "0123456789abcdef0123456789abcdef").unwrap();
    let settings = |tokens: &Path, jwks: &Path| AuthSettings {
        tokens_file: Some(tokens.to_path_buf()),
        jwks_file: Some(jwks.to_path_buf()),
        jwt_issuers: vec!["https://id.example".into()],
        job_token_key: Some(job_key.clone()),
        ..Default::default()
    };
    let seeds = vec![
        ("tokens".to_string(), [vec![0], tokens.clone().into_bytes()].concat()),
        ("jwks".to_string(), [vec![1], key.jwks.clone().into_bytes()].concat()),
    ];
    let (fuzz_tokens, fuzz_jwks) = (dir.path().join("fuzz-tokens.toml"), dir.path().join("fuzz-jwks.json"));
    fuzz("auth_files", seeds, budget(), |bytes| {
        let Some((kind, rest)) = bytes.split_first() else { return Ok(()) };
        let (tokens, jwks) = if kind % 2 == 0 { (&fuzz_tokens, &jwks_path) } else { (&tokens_path, &fuzz_jwks) };
        std::fs::write(&tokens_path, tokens_file_text(&secret)).unwrap();
        std::fs::write(&jwks_path, &key.jwks).unwrap();
        std::fs::write(if kind % 2 == 0 { &fuzz_tokens } else { &fuzz_jwks }, rest).unwrap();
        if let Ok(auth) = Authenticator::load(settings(tokens, jwks)) {
            let _ = auth.authenticate(Some(&format!("Bearer {secret}")));
        }
        Ok(())
    });

    std::fs::write(&tokens_path, &tokens).unwrap();
    std::fs::write(&jwks_path, &key.jwks).unwrap();
    let auth = Authenticator::load(settings(&tokens_path, &jwks_path)).unwrap();
    let jwt = create_token(
        &key.private_pem,
        "https://id.example",
        "ci",
        &strings(&["jobs:*"]),
        &strings(&["*"]),
        Duration::from_secs(600),
    )
    .unwrap();
    let job_token = auth.job_token(JobKey::new(1, 7).0, 2, drover::auth::now_ms() as i64 + 60_000);
    let seeds = vec![
        ("secret".to_string(), secret.clone().into_bytes()),
        ("jwt".to_string(), jwt.into_bytes()),
        ("job-token".to_string(), job_token.into_bytes()),
    ];
    fuzz("bearer_token", seeds, budget(), |bytes| {
        let header = format!("Bearer {}", String::from_utf8_lossy(bytes));
        let _ = auth.authenticate(Some(&header));
        Ok(())
    });
}

fn tokens_file_text(secret: &str) -> String {
    drover::auth::keys::token_entry("ops", secret, &["jobs:*".into()], &["*".into()])
}

/// Requests to every unary and server-streaming RPC of both client
/// services, decoded from bytes as tonic decodes them and answered by the
/// real services of a running node. Client-streaming RPCs (CreateJobs,
/// CompleteJobs) take the same messages and are left to the live campaign.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_requests_through_the_services() {
    use drover::gateway::zeebe::ZeebeService;
    use drover::gateway::GatewayService;
    use drover::proto::gateway as pb;
    use drover::proto::gateway::gateway_server::Gateway as _;
    use drover::proto::zeebe as zb;
    use drover::proto::zeebe::gateway_server::Gateway as _;
    use futures::StreamExt;
    use prost::Message;

    let node = common::LocalNode::start().await;
    let ctx = node.node().ctx.clone();
    let (native, zeebe) = (GatewayService::new(ctx.clone()), ZeebeService::new(ctx));
    let client = node.client.clone();
    let made = client
        .raw()
        .create_job(pb::CreateJobRequest { r#type: "a".into(), variables: r#"{"n":1}"#.into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .key;

    let seeds: Vec<(String, Vec<u8>)> = vec![
        (
            "CreateJob",
            pb::CreateJobRequest {
                r#type: "a".into(),
                variables: r#"{"x":[1,2]}"#.into(),
                retries: Some(2),
                idempotency_key: "k".into(),
                stages: vec!["s".into()],
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "ActivateJobs",
            pb::ActivateJobsRequest {
                r#type: "a".into(),
                worker: "w".into(),
                timeout: 1000,
                max_jobs_to_activate: 2,
                request_timeout: -1,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "StreamActivatedJobs",
            pb::StreamActivatedJobsRequest {
                r#type: "a".into(),
                worker: "w".into(),
                timeout: 1000,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "CompleteJob",
            pb::CompleteJobRequest { key: made, attempt: 1, variables: "{}".into(), override_fence: false }
                .encode_to_vec(),
        ),
        (
            "FailJob",
            pb::FailJobRequest {
                key: made,
                attempt: 1,
                retries: 1,
                error_message: "no".into(),
                retry_back_off: 10,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "UpdateJobTimeout",
            pb::UpdateJobTimeoutRequest { key: made, attempt: 1, timeout: 5000, override_fence: false }.encode_to_vec(),
        ),
        ("UpdateJobRetries", pb::UpdateJobRetriesRequest { key: made, retries: 3 }.encode_to_vec()),
        ("CancelJob", pb::CancelJobRequest { key: made }.encode_to_vec()),
        ("GetJob", pb::GetJobRequest { key: made, include_history: true, ..Default::default() }.encode_to_vec()),
        ("GetJobHistory", pb::GetJobRequest { key: made, ..Default::default() }.encode_to_vec()),
        ("AwaitJob", pb::AwaitJobRequest { key: made, timeout: 10, ..Default::default() }.encode_to_vec()),
        (
            "CheckpointJob",
            pb::CheckpointJobRequest { key: made, attempt: 1, stage: "s".into(), variables: "{}".into() }
                .encode_to_vec(),
        ),
        (
            "ListJobs",
            pb::ListJobsRequest {
                filter: Some(pb::JobFilter { state: "incident".into(), r#type: "a".into(), ..Default::default() }),
                page_size: 10,
                page_token: String::new(),
            }
            .encode_to_vec(),
        ),
        (
            "RetryJobs",
            pb::RetryJobsRequest {
                filter: Some(pb::JobFilter { state: "incident".into(), ..Default::default() }),
                retries: 1,
                dry_run: true,
            }
            .encode_to_vec(),
        ),
        (
            "CancelJobs",
            pb::CancelJobsRequest {
                filter: Some(pb::JobFilter { r#type: "nothing-here".into(), ..Default::default() }),
                dry_run: true,
            }
            .encode_to_vec(),
        ),
        ("Topology", pb::TopologyRequest {}.encode_to_vec()),
        (
            "RegisterWorker",
            pb::RegisterWorkerRequest {
                worker_id: "w".into(),
                job_types: vec!["a".into()],
                labels: vec!["team:x".into()],
                heartbeat_interval: 1000,
                dead_after: 5000,
                concurrency: 2,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "Heartbeat",
            pb::HeartbeatRequest {
                session_id: 1,
                state: "running".into(),
                jobs: vec![pb::HeldJob { key: made, attempt: 1 }],
            }
            .encode_to_vec(),
        ),
        ("DeregisterWorker", pb::DeregisterWorkerRequest { session_id: 1 }.encode_to_vec()),
        ("ListWorkers", pb::ListWorkersRequest { label: "team:x".into() }.encode_to_vec()),
        (
            "SetWorkerState",
            pb::SetWorkerStateRequest { session_id: 1, state: "quiet".into(), ..Default::default() }.encode_to_vec(),
        ),
        (
            "SetSchema",
            pb::SetSchemaRequest { r#type: "schema-fuzz".into(), schema: r#"{"type":"object"}"#.into() }
                .encode_to_vec(),
        ),
        ("GetSchema", pb::GetSchemaRequest { r#type: "schema-fuzz".into() }.encode_to_vec()),
        (
            "Zeebe.ActivateJobs",
            zb::ActivateJobsRequest {
                r#type: "a".into(),
                worker: "z".into(),
                timeout: 1000,
                max_jobs_to_activate: 3,
                request_timeout: -1,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "Zeebe.StreamActivatedJobs",
            zb::StreamActivatedJobsRequest {
                r#type: "a".into(),
                worker: "z".into(),
                timeout: 1000,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        ("Zeebe.CompleteJob", zb::CompleteJobRequest { job_key: made as i64, variables: "{}".into() }.encode_to_vec()),
        (
            "Zeebe.FailJob",
            zb::FailJobRequest {
                job_key: made as i64,
                retries: 1,
                error_message: "no".into(),
                retry_back_off: 10,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "Zeebe.ThrowError",
            zb::ThrowErrorRequest {
                job_key: made as i64,
                error_code: "E".into(),
                error_message: "m".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        ("Zeebe.UpdateJobRetries", zb::UpdateJobRetriesRequest { job_key: made as i64, retries: 2 }.encode_to_vec()),
        ("Zeebe.UpdateJobTimeout", zb::UpdateJobTimeoutRequest { job_key: made as i64, timeout: 5000 }.encode_to_vec()),
        ("Zeebe.Topology", zb::TopologyRequest {}.encode_to_vec()),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (name, bytes))| (name.to_string(), [vec![i as u8], bytes].concat()))
    .collect();
    const RPCS: u8 = 31;
    assert_eq!(seeds.len(), RPCS as usize);

    /// A call's request, bounded: the harness does not wait out long polls.
    /// The services are called directly, so the call is what the call layer
    /// would have made of an anonymous caller's `grpc-timeout: 300m`.
    fn request<T>(message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let deadline = Instant::now() + Duration::from_millis(300);
        let principal = std::sync::Arc::new(drover::auth::Principal::anonymous());
        let call =
            drover::gateway::Call { principal, deadline, caller_deadline: Some(deadline), traceparent: String::new() };
        request.extensions_mut().insert(call);
        request
    }
    fn code<T>(answer: &Result<T, tonic::Status>) -> tonic::Code {
        answer.as_ref().err().map_or(tonic::Code::Ok, |s| s.code())
    }
    async fn drained<S, T>(answer: Result<tonic::Response<S>, tonic::Status>) -> tonic::Code
    where
        S: futures::Stream<Item = Result<T, tonic::Status>> + Unpin,
    {
        let mut stream = match answer {
            Ok(stream) => stream.into_inner(),
            Err(status) => return status.code(),
        };
        // The first answer (or the stream's end) within a bound; a stream
        // that stays open without jobs is a proper answer too.
        match tokio::time::timeout(Duration::from_millis(300), stream.next()).await {
            Ok(Some(Err(status))) => status.code(),
            _ => tonic::Code::Ok,
        }
    }

    let corpus = corpus("grpc_request", seeds);
    let mut mutator = Mutator { rng: StdRng::seed_from_u64(seed() ^ fnv("grpc_request")) };
    let started = Instant::now();
    let mut codes: BTreeMap<String, u64> = BTreeMap::new();
    let mut undecodable = 0u64;
    let mut slowest: BTreeMap<u8, Duration> = BTreeMap::new();
    let mut executions = 0u64;
    let time = budget() * 5;
    let mut inputs = corpus.clone().into_iter();
    loop {
        let input = match inputs.next() {
            Some(input) => input,
            None if started.elapsed() < time => mutator.mutate(&corpus),
            None => break,
        };
        executions += 1;
        let Some((rpc, bytes)) = input.split_first() else { continue };
        let call_started = Instant::now();
        macro_rules! unary {
            ($service:expr, $method:ident, $type:ty) => {
                match <$type>::decode(bytes) {
                    Ok(message) => code(&$service.$method(request(message)).await),
                    Err(_) => {
                        undecodable += 1;
                        continue;
                    }
                }
            };
        }
        macro_rules! streaming {
            ($service:expr, $method:ident, $type:ty) => {
                match <$type>::decode(bytes) {
                    Ok(message) => drained($service.$method(request(message)).await).await,
                    Err(_) => {
                        undecodable += 1;
                        continue;
                    }
                }
            };
        }
        let answer = match rpc % RPCS {
            0 => unary!(native, create_job, pb::CreateJobRequest),
            1 => streaming!(native, activate_jobs, pb::ActivateJobsRequest),
            2 => streaming!(native, stream_activated_jobs, pb::StreamActivatedJobsRequest),
            3 => unary!(native, complete_job, pb::CompleteJobRequest),
            4 => unary!(native, fail_job, pb::FailJobRequest),
            5 => unary!(native, update_job_timeout, pb::UpdateJobTimeoutRequest),
            6 => unary!(native, update_job_retries, pb::UpdateJobRetriesRequest),
            7 => unary!(native, cancel_job, pb::CancelJobRequest),
            8 => unary!(native, get_job, pb::GetJobRequest),
            9 => unary!(native, get_job_history, pb::GetJobRequest),
            10 => streaming!(native, await_job, pb::AwaitJobRequest),
            11 => unary!(native, checkpoint_job, pb::CheckpointJobRequest),
            12 => unary!(native, list_jobs, pb::ListJobsRequest),
            13 => unary!(native, retry_jobs, pb::RetryJobsRequest),
            14 => unary!(native, cancel_jobs, pb::CancelJobsRequest),
            15 => unary!(native, topology, pb::TopologyRequest),
            16 => unary!(native, register_worker, pb::RegisterWorkerRequest),
            17 => unary!(native, heartbeat, pb::HeartbeatRequest),
            18 => unary!(native, deregister_worker, pb::DeregisterWorkerRequest),
            19 => unary!(native, list_workers, pb::ListWorkersRequest),
            20 => unary!(native, set_worker_state, pb::SetWorkerStateRequest),
            21 => unary!(native, set_schema, pb::SetSchemaRequest),
            22 => unary!(native, get_schema, pb::GetSchemaRequest),
            23 => streaming!(zeebe, activate_jobs, zb::ActivateJobsRequest),
            24 => streaming!(zeebe, stream_activated_jobs, zb::StreamActivatedJobsRequest),
            25 => unary!(zeebe, complete_job, zb::CompleteJobRequest),
            26 => unary!(zeebe, fail_job, zb::FailJobRequest),
            27 => unary!(zeebe, throw_error, zb::ThrowErrorRequest),
            28 => unary!(zeebe, update_job_retries, zb::UpdateJobRetriesRequest),
            29 => unary!(zeebe, update_job_timeout, zb::UpdateJobTimeoutRequest),
            _ => unary!(zeebe, topology, zb::TopologyRequest),
        };
        *codes.entry(format!("{answer:?}")).or_default() += 1;
        let slowest = slowest.entry(rpc % RPCS).or_insert(Duration::ZERO);
        *slowest = (*slowest).max(call_started.elapsed());
        if matches!(answer, tonic::Code::Unknown | tonic::Code::Internal) {
            failed("grpc_request", &input, &format!("answered {answer:?}"));
        }
    }
    println!(
        "fuzz grpc_request: {executions} executions in {:.1} s from a corpus of {}; {undecodable} not protobuf for their RPC; answers {codes:?}",
        started.elapsed().as_secs_f64(),
        corpus.len()
    );
    let slow: Vec<String> = slowest
        .iter()
        .filter(|(_, d)| **d > Duration::from_millis(500))
        .map(|(rpc, d)| format!("{rpc}: {d:?}"))
        .collect();
    println!("fuzz grpc_request: RPCs (by seed number) that took over 500 ms at least once: {slow:?}");
    // The node is still whole: it serves a job end to end.
    let key = client
        .raw()
        .create_job(pb::CreateJobRequest { r#type: "after-fuzz".into(), ..Default::default() })
        .await
        .expect("the node still takes jobs")
        .into_inner()
        .key;
    assert_ne!(key, 0);
}
