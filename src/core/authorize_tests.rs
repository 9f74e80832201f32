//! Authorization at apply ([`Command::As`]): a principal's command on a job
//! or session it may not touch is refused by the engine itself and changes
//! nothing, whatever a gateway let through.

use std::sync::Arc;

use super::principal::Principal;
use super::*;

const TYPE: &str = "t";

pub(super) fn principal(name: &str, scopes: &[&str], tenants: &[&str]) -> Arc<Principal> {
    Arc::new(Principal {
        name: name.into(),
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
        tenants: tenants.iter().map(|s| s.to_string()).collect(),
        job: None,
    })
}

fn acme() -> Arc<Principal> {
    principal("acme", &["jobs:*"], &["acme"])
}

fn globex() -> Arc<Principal> {
    principal("globex", &["jobs:*", "workers:manage"], &["globex"])
}

fn by(who: &Arc<Principal>, command: Command) -> Command {
    Command::As { by: Arc::clone(who), commands: vec![command] }
}

fn create(tenant: &str) -> Command {
    Command::Create(NewJob {
        spec: Arc::new(JobSpec { job_type: TYPE.into(), tenant: tenant.into(), ..Default::default() }),
        retries: 3,
        run_at: None,
        delay_ms: 0,
        request: None,
        dedupe_window_ms: 0,
    })
}

fn activate(tenant: &str, session: SessionId) -> Command {
    Command::Activate(Activation { session, ..Activation::plain(TYPE, tenant) })
}

fn session(id: SessionId, tenant: &str) -> Command {
    Command::Register(Arc::new(SessionInfo {
        id,
        worker: "w".into(),
        hostname: "h".into(),
        pid: 1,
        job_types: vec![TYPE.into()],
        concurrency: 1,
        labels: Vec::new(),
        tenants: vec![tenant.into()],
        heartbeat_ms: 1_000,
        dead_after_ms: 10_000,
    }))
}

struct Partition {
    state: PartitionState,
    now: Millis,
}

impl Partition {
    fn new() -> Self {
        Partition { state: PartitionState::new(0), now: 1_000 }
    }

    fn run(&mut self, command: Command) -> CommandResult {
        self.now += 1;
        self.state.apply(&Batch::at(self.now, vec![command])).results.pop().expect("one result per command")
    }

    /// A job of `tenant`'s, made by acme's operator and activated by it.
    fn activated_job(&mut self, tenant: &str) -> JobKey {
        let admin = principal("admin", &["*"], &["*"]);
        let CommandResult::Created { key, .. } = self.run(by(&admin, create(tenant))) else { panic!("created") };
        let CommandResult::Activated(jobs) = self.run(by(&admin, activate(tenant, 0))) else { panic!("activated") };
        assert_eq!(jobs.iter().map(|j| j.key).collect::<Vec<_>>(), vec![key]);
        key
    }

    fn refused(&mut self, command: Command) -> ErrorKind {
        match self.run(command) {
            CommandResult::Rejected(error) => error.kind,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn another_tenants_job_is_not_found_at_apply_and_unchanged() {
    let mut p = Partition::new();
    let key = p.activated_job("acme");
    let before = p.state.job(key).cloned().expect("live");
    let refusals = [
        Command::Cancel { key, by: "globex".into() },
        Command::UpdateRetries { key, retries: 9, by: "globex".into() },
        Command::Complete { key, attempt: 1, variables: r#"{"forged":true}"#.into() },
        // globex may manage its own jobs: an override of acme's is still not its to make.
        Command::Complete { key, attempt: 0, variables: r#"{"forged":true}"#.into() },
        Command::UpdateTimeout { key, attempt: 1, timeout_ms: 1 },
        Command::FailByPolicy {
            key,
            attempt: 1,
            error_message: "forged".into(),
            error_type: String::new(),
            retryable: false,
            jitter: 0,
            variables: Default::default(),
            max_payload_bytes: 1 << 20,
        },
        Command::Checkpoint {
            key,
            attempt: 1,
            stage: "s".into(),
            variables: Default::default(),
            max_payload_bytes: 1 << 20,
        },
    ];
    for command in refusals {
        assert_eq!(p.refused(by(&globex(), command.clone())), ErrorKind::NotFound, "{command:?}");
    }
    let after = p.state.job(key).expect("still live");
    assert_eq!((after.state, after.attempt, after.retries), (before.state, before.attempt, before.retries));
    assert_eq!(after.spec.variables, before.spec.variables, "no forged variables");
    assert_eq!(after.deadline, before.deadline);
    // Its own tenant's principal may.
    assert!(matches!(p.run(by(&acme(), Command::Cancel { key, by: "acme".into() })), CommandResult::Done));
}

#[test]
fn a_missing_scope_or_an_unfenced_attempt_is_permission_denied_at_apply() {
    let mut p = Partition::new();
    let key = p.activated_job("acme");
    let worker = principal("acme-worker", &["jobs:work:t"], &["acme"]);
    let cancel = Command::Cancel { key, by: "acme-worker".into() };
    assert_eq!(p.refused(by(&worker, cancel)), ErrorKind::PermissionDenied);
    let override_ = Command::Complete { key, attempt: 0, variables: Default::default() };
    assert_eq!(p.refused(by(&worker, override_)), ErrorKind::PermissionDenied, "attempt 0 needs manage");
    let token = Arc::new(Principal::for_job(key.0 + 1, 1));
    let other = Command::Complete { key, attempt: 1, variables: Default::default() };
    assert_eq!(p.refused(by(&token, other)), ErrorKind::PermissionDenied, "a token for another job");
    let own = Arc::new(Principal::for_job(key.0, 1));
    let complete = Command::Complete { key, attempt: 1, variables: Default::default() };
    assert!(matches!(p.run(by(&own, complete)), CommandResult::Done), "its own job and attempt");
}

#[test]
fn creates_and_activations_are_judged_against_the_tenants_they_name() {
    let mut p = Partition::new();
    let counter = p.state.meta().next_counter;
    assert_eq!(p.refused(by(&globex(), create("acme"))), ErrorKind::PermissionDenied);
    assert_eq!(p.state.meta().next_counter, counter, "no job was made");
    let creator = principal("maker", &["jobs:create:other"], &["acme"]);
    assert_eq!(p.refused(by(&creator, create("acme"))), ErrorKind::PermissionDenied, "scope of another type");
    assert!(matches!(p.run(by(&acme(), create("acme"))), CommandResult::Created { created: true, .. }));
    assert_eq!(p.refused(by(&globex(), activate("acme", 0))), ErrorKind::PermissionDenied);
    let CommandResult::Activated(jobs) = p.run(by(&acme(), activate("acme", 0))) else { panic!("activates") };
    assert_eq!(jobs.len(), 1, "the job waited for its own tenant's worker");
}

#[test]
fn another_tenants_session_is_neither_beaten_ended_nor_directed_at_apply() {
    let mut p = Partition::new();
    assert!(matches!(p.run(by(&acme(), session(7, "acme"))), CommandResult::Done));
    assert_eq!(p.refused(by(&globex(), session(8, "acme"))), ErrorKind::PermissionDenied, "register for acme");
    let other_type = principal("acme-other", &["jobs:work:other"], &["acme"]);
    assert_eq!(p.refused(by(&other_type, session(9, "acme"))), ErrorKind::PermissionDenied, "a type it may not work");
    let beat = Command::Beat { session: 7, state: WorkerState::Quiet, held: Vec::new() };
    assert_eq!(p.refused(by(&globex(), beat)), ErrorKind::PermissionDenied);
    assert_eq!(p.refused(by(&globex(), Command::EndSession { session: 7 })), ErrorKind::PermissionDenied);
    let one = Command::Direct { target: SessionTarget::One(7), state: WorkerState::Terminate };
    assert_eq!(p.refused(by(&globex(), one)), ErrorKind::PermissionDenied);
    let all = Command::Direct { target: SessionTarget::All, state: WorkerState::Terminate };
    assert_eq!(p.refused(by(&globex(), all)), ErrorKind::PermissionDenied, "all sessions need tenant *");
    let CommandResult::Sessions(sessions) = p.run(Command::ListSessions) else { panic!("lists") };
    assert_eq!(sessions.len(), 1, "sessions 8 and 9 were never made");
    let (session, _) = &sessions[0];
    assert_eq!((session.reported, session.directed), (WorkerState::Running, WorkerState::Running));
    let beat = Command::Beat { session: 7, state: WorkerState::Quiet, held: Vec::new() };
    assert!(matches!(p.run(by(&acme(), beat)), CommandResult::Beat { .. }), "its owner's tenant may");
}

#[test]
fn every_replica_decides_alike() {
    let (mut a, mut b) = (Partition::new(), Partition::new());
    let key = a.activated_job("acme");
    assert_eq!(b.activated_job("acme"), key);
    let batch = Batch::at(
        5_000,
        vec![
            by(&globex(), Command::Cancel { key, by: "globex".into() }),
            by(&acme(), Command::Complete { key, attempt: 1, variables: Default::default() }),
        ],
    );
    assert_eq!(a.state.apply(&batch).results, b.state.apply(&batch).results);
}

#[test]
fn an_override_of_the_fence_is_written_in_the_history_with_who_sent_it() {
    let mut p = Partition::new();
    let key = p.activated_job("acme");
    let operator = principal("acme-operator", &["jobs:work:t", "jobs:manage:t"], &["acme"]);
    let timeout = Command::UpdateTimeout { key, attempt: 0, timeout_ms: 5_000 };
    assert!(matches!(p.run(by(&operator, timeout)), CommandResult::Deadline(_)));
    let complete = Command::Complete { key, attempt: 0, variables: r#"{"by":"operator"}"#.into() };
    let mut out = p.state.apply(&Batch::at(p.now + 1, vec![by(&operator, complete)]));
    assert_eq!(out.results, vec![CommandResult::Done]);
    let job = out.finished.pop().expect("completed");
    let overrides: Vec<&EventKind> =
        job.history.events().map(|e| &e.kind).filter(|k| matches!(k, EventKind::FenceOverridden { .. })).collect();
    let named = EventKind::FenceOverridden { attempt: 1, by: "acme-operator".into() };
    assert_eq!(overrides, vec![&named, &named], "the timeout update and the completion");
    assert!(matches!(job.history.events().last().map(|e| &e.kind), Some(EventKind::FenceOverridden { .. })));
}

#[test]
fn a_run_of_one_principals_commands_answers_each_in_order() {
    let mut p = Partition::new();
    let theirs = p.activated_job("globex");
    let run = Command::As {
        by: acme(),
        commands: vec![
            create("acme"),
            Command::Cancel { key: theirs, by: "acme".into() },
            create("globex"),
            create("acme"),
        ],
    };
    let out = p.state.apply(&Batch::at(9_000, vec![run, Command::ListSessions]));
    let kinds: Vec<&str> = out
        .results
        .iter()
        .map(|r| match r {
            CommandResult::Created { .. } => "created",
            CommandResult::Rejected(e) if e.kind == ErrorKind::NotFound => "not found",
            CommandResult::Rejected(e) if e.kind == ErrorKind::PermissionDenied => "denied",
            CommandResult::Sessions(_) => "sessions",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["created", "not found", "denied", "created", "sessions"]);
    assert_eq!(p.state.job(theirs).map(|j| j.state), Some(JobState::Activated), "globex's job untouched");
}

fn owned_session(id: SessionId, tenant: &str) -> Command {
    let Command::Register(info) = session(id, tenant) else { unreachable!() };
    Command::RegisterOwned(info)
}

#[test]
fn an_owned_session_is_acted_as_by_its_owner_or_a_manager_only() {
    let mut p = Partition::new();
    let key = p.activated_job("acme");
    let owner = principal("acme-worker-1", &["jobs:work:t"], &["acme"]);
    let peer = principal("acme-worker-2", &["jobs:work:t"], &["acme"]);
    let manager = principal("acme-operator", &["jobs:work:t", "workers:manage"], &["acme"]);
    assert!(matches!(p.run(by(&owner, owned_session(7, "acme"))), CommandResult::Done));
    assert_eq!(p.state.session_owners(), vec![(7, "acme-worker-1".to_string())]);
    // Another principal of the same tenant, with the same scopes, is not its owner.
    let beat = || Command::Beat { session: 7, state: WorkerState::Quiet, held: vec![(key, 1)] };
    assert_eq!(p.refused(by(&peer, beat())), ErrorKind::PermissionDenied, "a beat");
    assert_eq!(p.refused(by(&peer, Command::EndSession { session: 7 })), ErrorKind::PermissionDenied, "an end");
    assert_eq!(p.refused(by(&peer, activate("acme", 7))), ErrorKind::PermissionDenied, "an activation under it");
    assert_eq!(p.refused(by(&peer, owned_session(7, "acme"))), ErrorKind::PermissionDenied, "a re-registration");
    assert_eq!(p.refused(by(&peer, Command::ActAs { session: 7 })), ErrorKind::PermissionDenied, "a stream");
    let CommandResult::Sessions(sessions) = p.run(Command::ListSessions) else { panic!("lists") };
    assert_eq!(sessions[0].0.reported, WorkerState::Running, "no stranger's beat applied");
    assert_eq!(p.state.session_owners(), vec![(7, "acme-worker-1".to_string())], "its owner stays");
    // Its owner, and a manager of its tenants, may.
    assert!(matches!(p.run(by(&owner, Command::ActAs { session: 7 })), CommandResult::Done));
    assert!(matches!(p.run(by(&manager, Command::ActAs { session: 7 })), CommandResult::Done));
    assert!(matches!(p.run(by(&owner, beat())), CommandResult::Beat { .. }));
    // A manager of another tenant may not: the session serves acme.
    let foreign_manager = principal("globex-operator", &["jobs:*", "workers:manage"], &["globex"]);
    assert_eq!(p.refused(by(&foreign_manager, Command::ActAs { session: 7 })), ErrorKind::PermissionDenied);
    assert!(matches!(p.run(by(&manager, Command::EndSession { session: 7 })), CommandResult::Done));
    assert_eq!(p.state.session_owners(), Vec::new(), "an ended session's owner goes with it");
    assert!(
        matches!(p.run(by(&owner, Command::ActAs { session: 7 })), CommandResult::Rejected(e) if e.kind == ErrorKind::NotFound)
    );
}

#[test]
fn a_session_registered_before_owners_is_any_of_its_tenants_principals() {
    let mut p = Partition::new();
    let peer = principal("acme-worker-2", &["jobs:work:t"], &["acme"]);
    assert!(matches!(p.run(by(&acme(), session(7, "acme"))), CommandResult::Done));
    assert_eq!(p.state.session_owners(), Vec::new());
    let beat = Command::Beat { session: 7, state: WorkerState::Running, held: Vec::new() };
    assert!(matches!(p.run(by(&peer, beat)), CommandResult::Beat { .. }), "as at data version 8");
    // Outside a principal's run (tokens off), an owned registration has no owner.
    assert!(matches!(p.run(owned_session(8, "acme")), CommandResult::Done));
    assert_eq!(p.state.session_owners(), Vec::new());
}

#[test]
fn owners_survive_a_restore_and_die_with_their_session() {
    let mut p = Partition::new();
    let owner = principal("acme-worker-1", &["jobs:work:t"], &["acme"]);
    assert!(matches!(p.run(by(&owner, owned_session(7, "acme"))), CommandResult::Done));
    let registry = p.state.registry();
    assert_eq!(registry.owners, vec![(7, "acme-worker-1".to_string())]);
    let restored = PartitionState::restore(p.state.meta(), Vec::new(), Vec::new(), registry);
    assert_eq!(restored.session_owners(), p.state.session_owners());
    // Its lease runs out: the session and its owner go.
    let out = p.state.apply(&Batch::at(p.now + 60_000, Vec::new()));
    assert_eq!(out.sessions_died.len(), 1);
    assert_eq!(p.state.session_owners(), Vec::new());
}

#[test]
fn only_an_admin_of_every_tenant_changes_the_cluster_plan_at_apply() {
    let mut p = Partition::new();
    let member = crate::core::Member { addr: "10.0.0.0:26502".into(), ..Default::default() };
    let formed = Box::new(crate::core::ClusterPlan::initial([(0, member)].into(), vec![vec![0]], 1));
    let pause = || Command::ChangePlan { initial: formed.clone(), epoch: None, change: crate::core::PlanChange::Pause };
    let one_tenant = principal("ops", &["cluster:admin"], &["acme"]);
    assert_eq!(p.refused(by(&one_tenant, pause())), ErrorKind::PermissionDenied, "one tenant's admin");
    let reader = principal("reader", &["cluster:read"], &["*"]);
    assert_eq!(p.refused(by(&reader, pause())), ErrorKind::PermissionDenied, "a reader");
    let admin = principal("ops", &["cluster:admin"], &["*"]);
    assert!(matches!(p.run(by(&admin, pause())), CommandResult::Plan(Some(plan)) if plan.paused));
}

#[test]
fn the_brokers_own_commands_for_added_partitions_are_refused_to_every_principal() {
    let mut p = Partition::new();
    let admin = principal("ops", &["cluster:admin", "jobs:*"], &["*"]);
    let probe = Command::ProbeKey {
        request: RequestId::Key { tenant: "globex".into(), user: String::new(), key: "k".into() },
        to: 1,
        window_ms: 60_000,
        fingerprint: 0,
    };
    // Every tenant's sessions and schemas are in what a new partition adopts.
    for command in [probe, Command::GetAdoptable, Command::Adopt(Box::default())] {
        assert_eq!(p.refused(by(&acme(), command.clone())), ErrorKind::PermissionDenied, "{command:?}");
        assert_eq!(p.refused(by(&admin, command.clone())), ErrorKind::PermissionDenied, "{command:?} by an admin");
    }
}
