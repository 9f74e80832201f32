//! Cron schedules: expressions and zones, and the engine's ticks: one job
//! per tick whatever entries carry the time, misfires, overlaps, pauses,
//! restores and who may schedule.

use std::sync::Arc;

use super::principal::Principal;
use super::schedule::{Misfire, Overlap, Timetable, SCHEDULE_HEADER, TICK_HEADER};
use super::*;

const TYPE: &str = "report";
/// 2026-11-28T00:00:00Z.
const MIDNIGHT: Millis = 1_795_824_000_000;

fn utc(expression: &str) -> Timetable {
    Timetable::parse(expression, "UTC").unwrap_or_else(|e| panic!("{expression}: {e}"))
}

#[test]
fn expressions_of_five_and_six_fields_aliases_and_intervals_parse() {
    assert_eq!(utc("*/5 * * * *").next_after(MIDNIGHT, MIDNIGHT), Some(MIDNIGHT + 5 * 60_000));
    assert_eq!(utc("*/10 * * * * *").next_after(MIDNIGHT, MIDNIGHT), Some(MIDNIGHT + 10_000), "seconds first");
    assert_eq!(utc("@hourly").next_after(MIDNIGHT, MIDNIGHT), Some(MIDNIGHT + 3_600_000));
    for alias in ["@daily", "@midnight"] {
        assert_eq!(utc(alias).next_after(MIDNIGHT, MIDNIGHT), Some(MIDNIGHT + 86_400_000), "{alias}");
    }
    for alias in ["@weekly", "@monthly", "@yearly", "@annually"] {
        assert!(utc(alias).next_after(MIDNIGHT, MIDNIGHT).is_some(), "{alias}");
    }
    // November 28th 2026 is a Saturday: @weekly is Sunday midnight.
    assert_eq!(utc("@weekly").next_after(MIDNIGHT, MIDNIGHT), Some(MIDNIGHT + 86_400_000));
    let every = utc("@every 1h30m");
    assert_eq!(every.next_after(MIDNIGHT, MIDNIGHT), Some(MIDNIGHT + 5_400_000));
    assert_eq!(every.next_after(MIDNIGHT + 6_000_000, MIDNIGHT), Some(MIDNIGHT + 10_800_000), "from its anchor");
}

#[test]
fn invalid_expressions_and_zones_are_refused_saying_why() {
    for (expression, says) in [
        ("not a valid cron", "fields"),
        ("0 0 0 0 0 0 0", "7 fields"),
        ("99 25 32 13 8", "not valid"),
        ("* * *", "3 fields"),
        ("0 0 30 2 *", "never matches"),
        ("@every 500ms", "shorter than a second"),
        ("@every soon", "@every needs a duration"),
        ("@fortnightly", "not valid"),
    ] {
        let error = Timetable::parse(expression, "UTC").expect_err(expression);
        assert!(error.contains(says), "{expression}: {error}");
    }
    let error = Timetable::parse("@daily", "Mars/Olympus").expect_err("an unknown zone");
    assert!(error.contains("unknown time zone"), "{error}");
    // The partition refuses a template with an expiry too, not only the gateway.
    let mut expiring = spec("acme", "nightly", "@daily");
    Arc::make_mut(&mut expiring.template).custom_headers.push((EXPIRES_AT_HEADER.into(), "5000".into()));
    assert!(expiring.validate().expect_err("an expiring template").contains("no expiry"));
}

#[test]
fn a_zone_moves_the_ticks_and_a_skipped_hour_has_none() {
    // 09:00 in Tokyo (UTC+9, no daylight saving) is midnight UTC.
    let tokyo = Timetable::parse("0 9 * * *", "Asia/Tokyo").expect("parses");
    assert_eq!(tokyo.next_after(MIDNIGHT - 1, MIDNIGHT - 1), Some(MIDNIGHT));
    // New York springs forward at 02:00 on 2027-03-14: 02:30 does not exist
    // that day, so the tick after the 13th's is on the 15th.
    let new_york = Timetable::parse("30 2 * * *", "America/New_York").expect("parses");
    let march_13_0230 = 1_804_923_000_000; // 2027-03-13T07:30:00Z
    let next = new_york.next_after(march_13_0230, march_13_0230).expect("a next tick");
    assert_eq!(next, march_13_0230 + 2 * 86_400_000 - 3_600_000, "the 15th, 02:30 EDT");
    // It falls back at 02:00 on 2026-11-01: 01:30 happens twice, and ticks once.
    let fall = Timetable::parse("30 1 * * *", "America/New_York").expect("parses");
    let first_0130 = 1_793_511_000_000; // 2026-11-01T05:30:00Z, 01:30 EDT
    assert_eq!(fall.next_after(first_0130 - 1, first_0130 - 1), Some(first_0130));
    assert_eq!(fall.next_after(first_0130, first_0130), Some(1_793_601_000_000), "the 2nd, 01:30 EST");
}

fn spec(tenant: &str, name: &str, expression: &str) -> ScheduleSpec {
    ScheduleSpec {
        tenant: tenant.into(),
        name: name.into(),
        expression: expression.into(),
        timezone: "UTC".into(),
        template: Arc::new(JobSpec { job_type: TYPE.into(), tenant: tenant.into(), ..Default::default() }),
        retries: 3,
        overlap: Overlap::Allow,
        misfire: Misfire::FireAll,
        paused: false,
        description: String::new(),
    }
}

fn put(spec: ScheduleSpec) -> Command {
    Command::PutSchedule { spec: Arc::new(spec), by: "ops".into() }
}

struct Partition {
    state: PartitionState,
}

impl Partition {
    fn run_at(&mut self, now: Millis, command: Command) -> (CommandResult, ApplyOutput) {
        let mut out = self.state.apply(&Batch::at(now, vec![command]));
        (out.results.pop().expect("one result per command"), out)
    }
    /// An entry with no commands at `now`: what a leader proposes when a
    /// timer is due. Answers the ticks of the jobs it made.
    fn tick_at(&mut self, now: Millis) -> Vec<Millis> {
        let out = self.state.apply(&Batch::at(now, Vec::new()));
        let made: Vec<Millis> =
            self.state.jobs().filter(|job| out.touched.contains(&job.key)).filter_map(tick_of).collect();
        made
    }
    fn schedule(&mut self, tenant: &str, name: &str) -> Schedule {
        let (result, _) = self.run_at(self.state.clock(), Command::ListSchedules { tenants: vec![tenant.into()] });
        let CommandResult::Schedules(all) = result else { panic!("schedules: {result:?}") };
        all.into_iter().find(|s| s.spec.name == name).expect("the schedule")
    }
}

fn tick_of(job: &Job) -> Option<Millis> {
    let header = |name: &str| job.spec.custom_headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    assert_eq!(header(SCHEDULE_HEADER).as_deref(), Some("nightly"), "the job names its schedule");
    header(TICK_HEADER)?.parse().ok()
}

fn partition() -> Partition {
    Partition { state: PartitionState::new(0) }
}

#[test]
fn each_tick_makes_one_job_whatever_entries_carry_the_time() {
    let mut p = partition();
    let (result, out) = p.run_at(MIDNIGHT, put(spec("acme", "nightly", "* * * * * *")));
    let CommandResult::ScheduleSet { schedule, created: true } = result else { panic!("{result:?}") };
    assert!(out.schedules_changed);
    assert_eq!(schedule.next_at, MIDNIGHT + 1_000);
    assert_eq!(p.state.next_timer(), Some(MIDNIGHT + 1_000), "the leader's timer wakes for the tick");
    assert_eq!(p.tick_at(MIDNIGHT + 1_000), vec![MIDNIGHT + 1_000]);
    // The same time again (a new leader's first entry), and a leader whose
    // clock is behind: the tick is consumed.
    assert_eq!(p.tick_at(MIDNIGHT + 1_000), Vec::<Millis>::new());
    assert_eq!(p.tick_at(MIDNIGHT + 400), Vec::<Millis>::new());
    assert_eq!(p.tick_at(MIDNIGHT + 2_500), vec![MIDNIGHT + 2_000]);
    let schedule = p.schedule("acme", "nightly");
    assert_eq!((schedule.runs, schedule.last_at, schedule.next_at), (2, MIDNIGHT + 2_000, MIDNIGHT + 3_000));
    let job = p.state.job(schedule.last_job).expect("the last job is live");
    assert_eq!((job.spec.job_type.as_str(), job.spec.tenant.as_str(), job.retries), (TYPE, "acme", 3));
}

#[test]
fn passed_ticks_make_one_job_each_or_one_for_the_latest() {
    let mut p = partition();
    p.run_at(MIDNIGHT, put(spec("acme", "nightly", "* * * * * *")));
    // Ten seconds without an entry (no leader): every tick, oldest first.
    let made = p.tick_at(MIDNIGHT + 10_000);
    assert_eq!(made.len(), 10);
    assert_eq!(*made.iter().min().expect("ticks"), MIDNIGHT + 1_000);
    // A leader's clock jumped an hour: at most 100 ticks per entry, the
    // rest in the entries after it, none lost.
    let (mut total, mut entries) = (0, 0);
    while p.state.next_timer().is_some_and(|at| at <= MIDNIGHT + 3_600_000) {
        let made = p.tick_at(MIDNIGHT + 3_600_000);
        assert!(made.len() <= schedule::MAX_TICKS_PER_ENTRY);
        total += made.len();
        entries += 1;
    }
    assert_eq!((total, entries), (3_590, 36));
    let mut p = partition();
    p.run_at(MIDNIGHT, put(ScheduleSpec { misfire: Misfire::FireOnce, ..spec("acme", "nightly", "* * * * * *") }));
    assert_eq!(p.tick_at(MIDNIGHT + 10_500), vec![MIDNIGHT + 10_000], "fire once: the latest tick");
    let schedule = p.schedule("acme", "nightly");
    assert_eq!((schedule.runs, schedule.missed, schedule.next_at), (1, 9, MIDNIGHT + 11_000));
}

#[test]
fn overlap_policies_judge_the_previous_ticks_job() {
    let mut p = partition();
    let skip = ScheduleSpec { overlap: Overlap::Skip, ..spec("acme", "nightly", "* * * * * *") };
    p.run_at(MIDNIGHT, put(skip));
    assert_eq!(p.tick_at(MIDNIGHT + 1_000).len(), 1);
    assert_eq!(p.tick_at(MIDNIGHT + 2_000).len(), 0, "the first job still waits");
    let first = p.schedule("acme", "nightly").last_job;
    p.run_at(MIDNIGHT + 2_100, Command::Cancel { key: first, by: "op".into() });
    assert_eq!(p.tick_at(MIDNIGHT + 3_000).len(), 1, "the first is done");
    assert_eq!(p.schedule("acme", "nightly").skipped, 1);
    let cancel = ScheduleSpec { overlap: Overlap::CancelPrevious, ..spec("acme", "nightly", "* * * * * *") };
    let previous = p.schedule("acme", "nightly").last_job;
    let (result, _) = p.run_at(MIDNIGHT + 3_100, put(cancel));
    assert!(matches!(result, CommandResult::ScheduleSet { created: false, .. }), "an upsert: {result:?}");
    assert_eq!(p.tick_at(MIDNIGHT + 4_000).len(), 1);
    assert!(p.state.job(previous).is_none(), "the previous tick's job was cancelled");
    assert_eq!(p.schedule("acme", "nightly").runs, 3, "an upsert keeps the counts");
}

#[test]
fn a_paused_schedule_skips_its_ticks_and_a_deleted_one_is_gone() {
    let mut p = partition();
    p.run_at(MIDNIGHT, put(spec("acme", "nightly", "* * * * * *")));
    let pause = |paused| Command::SetSchedulePaused { tenant: "acme".into(), name: "nightly".into(), paused };
    p.run_at(MIDNIGHT + 500, pause(true));
    assert_eq!(p.state.next_timer(), None);
    assert_eq!(p.tick_at(MIDNIGHT + 5_000).len(), 0);
    p.run_at(MIDNIGHT + 5_200, pause(false));
    assert_eq!(p.schedule("acme", "nightly").next_at, MIDNIGHT + 6_000, "not made up for the pause");
    let (result, _) = p.run_at(MIDNIGHT + 5_300, Command::DeleteSchedule { tenant: "acme".into(), name: "x".into() });
    assert!(matches!(result, CommandResult::Rejected(CommandError { kind: ErrorKind::NotFound, .. })));
    p.run_at(MIDNIGHT + 5_400, Command::DeleteSchedule { tenant: "acme".into(), name: "nightly".into() });
    assert_eq!((p.state.next_timer(), p.tick_at(MIDNIGHT + 9_000).len()), (None, 0));
}

#[test]
fn a_schedule_survives_a_restore_with_its_next_tick_and_counts() {
    let mut p = partition();
    p.run_at(MIDNIGHT, put(spec("acme", "nightly", "* * * * * *")));
    p.tick_at(MIDNIGHT + 2_000);
    let registry = p.state.registry();
    assert_eq!(registry.schedules.len(), 1);
    let jobs: Vec<Job> = p.state.jobs().cloned().collect();
    let mut restored = Partition { state: PartitionState::restore(p.state.meta(), jobs, Vec::new(), registry) };
    assert_eq!(restored.state.next_timer(), Some(MIDNIGHT + 3_000));
    assert_eq!(restored.tick_at(MIDNIGHT + 2_000).len(), 0, "no tick twice after a restore");
    assert_eq!(restored.tick_at(MIDNIGHT + 3_000), vec![MIDNIGHT + 3_000]);
    assert_eq!(restored.schedule("acme", "nightly").runs, 3);
}

#[test]
fn only_a_creator_of_the_type_in_the_tenant_schedules() {
    let mut p = partition();
    let worker = Arc::new(Principal {
        name: "acme-worker".into(),
        scopes: vec!["jobs:work:report".into(), "jobs:read:report".into()],
        tenants: vec!["acme".into()],
        job: None,
    });
    let producer = Arc::new(Principal {
        name: "acme-producer".into(),
        scopes: vec!["jobs:create:report".into()],
        tenants: vec!["acme".into()],
        job: None,
    });
    let as_ = |by: &Arc<Principal>, c: Command| Command::As { by: Arc::clone(by), commands: vec![c] };
    let (result, _) = p.run_at(MIDNIGHT, as_(&worker, put(spec("acme", "nightly", "@daily"))));
    assert!(matches!(result, CommandResult::Rejected(CommandError { kind: ErrorKind::PermissionDenied, .. })));
    let (result, _) = p.run_at(MIDNIGHT, as_(&producer, put(spec("globex", "nightly", "@daily"))));
    assert!(matches!(result, CommandResult::Rejected(_)), "another tenant's: {result:?}");
    let (result, _) = p.run_at(MIDNIGHT, as_(&producer, put(spec("acme", "nightly", "@daily"))));
    assert!(matches!(result, CommandResult::ScheduleSet { created: true, .. }), "{result:?}");
    let delete = Command::DeleteSchedule { tenant: "acme".into(), name: "nightly".into() };
    let (result, _) = p.run_at(MIDNIGHT, as_(&worker, delete));
    assert!(matches!(result, CommandResult::Rejected(CommandError { kind: ErrorKind::PermissionDenied, .. })));
    assert_eq!(p.state.schedule_records().len(), 1);
}

#[test]
fn a_planted_dropped_tick_passes_over_one_tick_in_ten_and_records_it_run() {
    // The fault suite's `tick-dropped` control: a tick at 7 s into a 10 s
    // period of partition time makes no job, and the schedule says it ran.
    let mut p = partition();
    p.state.plant(Plants { drop_ticks: true, ..Plants::default() });
    p.run_at(MIDNIGHT, put(spec("acme", "nightly", "* * * * * *")));
    let made = p.tick_at(MIDNIGHT + 10_000);
    assert_eq!(made.len(), 9, "{made:?}");
    assert!(!made.contains(&(MIDNIGHT + 7_000)));
    let schedule = p.schedule("acme", "nightly");
    assert_eq!((schedule.runs, schedule.last_at), (9, MIDNIGHT + 10_000));
}
