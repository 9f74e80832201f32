//! Cron schedules: a named registration that makes one job at each tick of
//! a cron expression, read in an IANA time zone.
//!
//! A schedule lives on one partition (chosen by its tenant and name, like an
//! idempotency key) and is replicated state there, so a tick is consumed by
//! the same log entry that makes its job: whichever leader is in office, and
//! however often leaders change, each tick makes at most one job, and
//! [`Misfire::FireAll`] makes it exactly one. Ticks follow the partition's
//! time (the leaders' clocks, never running backwards; see
//! [`crate::core::Batch`]), not any one node's clock.
//!
//! This module owns the model and the expressions; the engine's
//! `schedules` fires them. Data version [`SCHEDULES`] on.

use std::str::FromStr;
use std::sync::Arc;

use chrono::TimeZone as _;
use serde::{Deserialize, Serialize};

use super::ids::{JobKey, Millis};
use super::job::JobSpec;

/// The data version from which schedules exist: their commands travel, and
/// snapshots holding schedules are written at this version or later.
pub const SCHEDULES: u16 = 12;

/// The custom header naming the schedule that made a job.
pub const SCHEDULE_HEADER: &str = "drover.schedule";
/// The custom header holding the tick (Unix ms) a scheduled job was made for.
pub const TICK_HEADER: &str = "drover.tick";

/// Ticks [`Misfire::FireAll`] makes jobs for in one entry; the rest follow
/// in the next ones, so no entry grows without bound.
pub const MAX_TICKS_PER_ENTRY: usize = 100;
/// Ticks [`Misfire::FireOnce`] counts one by one when it passes over many;
/// beyond them it jumps to the latest tick and counts no further.
const MAX_COUNTED_MISSES: u64 = 10_000;
/// The longest schedule name, expression and description.
pub const MAX_NAME: usize = 200;
pub const MAX_EXPRESSION: usize = 200;
pub const MAX_DESCRIPTION: usize = 1_000;
/// The shortest `@every` interval: ticks are at least a second apart.
pub const MIN_EVERY_MS: Millis = 1_000;

/// What a tick does while the job of the previous tick is still live
/// (scheduled, waiting or held by a worker; an incident counts as done).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Overlap {
    /// Make no job for this tick (counted as skipped).
    #[default]
    Skip,
    /// Make the job anyway; the jobs run side by side or queue up.
    Allow,
    /// Cancel the previous tick's job, then make this one.
    CancelPrevious,
}

impl Overlap {
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Allow => "allow",
            Overlap::CancelPrevious => "cancel_previous",
        }
    }
    /// A policy by its name; OJS's `enqueue` is `allow` here (a job made
    /// while another runs waits for a worker either way).
    pub fn parse(name: &str) -> Option<Overlap> {
        match name {
            "" | "skip" => Some(Overlap::Skip),
            "allow" | "enqueue" => Some(Overlap::Allow),
            "cancel_previous" => Some(Overlap::CancelPrevious),
            _ => None,
        }
    }
}

/// What happens when partition time passed several ticks at once: a
/// partition without a leader for a while, a leader's clock that jumped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Misfire {
    /// One job, for the latest tick passed; the others are counted as missed.
    #[default]
    FireOnce,
    /// One job for every tick passed, oldest first.
    FireAll,
}

impl Misfire {
    pub fn as_str(self) -> &'static str {
        match self {
            Misfire::FireOnce => "fire_once",
            Misfire::FireAll => "fire_all",
        }
    }
    pub fn parse(name: &str) -> Option<Misfire> {
        match name {
            "" | "fire_once" => Some(Misfire::FireOnce),
            "fire_all" => Some(Misfire::FireAll),
            _ => None,
        }
    }
}

/// What a user registers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    pub tenant: String,
    pub name: String,
    /// As given: five fields (minutes), six (seconds first), an alias
    /// (`@hourly`, `@daily`, ...) or `@every <duration>`.
    pub expression: String,
    /// IANA name; "UTC" when none was given.
    pub timezone: String,
    /// The job each tick makes (its tenant is the schedule's).
    pub template: Arc<JobSpec>,
    pub retries: i32,
    pub overlap: Overlap,
    pub misfire: Misfire,
    /// Registered paused: no tick until it is resumed.
    pub paused: bool,
    pub description: String,
}

/// A schedule as its partition keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub spec: ScheduleSpec,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// Who registered (or last changed) it.
    pub by: String,
    /// The next tick; 0 while paused or when the expression has no next time.
    pub next_at: Millis,
    /// The tick of the last job made (0: none yet).
    pub last_at: Millis,
    /// The last job made (0: none yet).
    pub last_job: JobKey,
    /// Jobs made.
    pub runs: u64,
    /// Ticks that made no job because the previous one's was still live.
    pub skipped: u64,
    /// Ticks passed over by [`Misfire::FireOnce`].
    pub missed: u64,
    /// Why the last tick made no job, when a create was refused (a schema
    /// the template fails, a payload over the limit); empty otherwise.
    pub last_error: String,
}

/// A parsed expression and zone: what computes ticks.
#[derive(Clone, Debug)]
pub struct Timetable {
    rule: Rule,
    zone: chrono_tz::Tz,
}

#[derive(Clone, Debug)]
enum Rule {
    Cron(Box<croner::Cron>),
    Every(Millis),
}

impl Timetable {
    /// Parses `expression` in `timezone` (empty: UTC); the error says what
    /// is wrong in words a user can act on.
    pub fn parse(expression: &str, timezone: &str) -> Result<Timetable, String> {
        let zone = match timezone {
            "" | "UTC" => chrono_tz::UTC,
            name => chrono_tz::Tz::from_str(name).map_err(|_| {
                format!("unknown time zone {name:?}: give an IANA name such as \"Europe/Berlin\" or \"UTC\"")
            })?,
        };
        let trimmed = expression.trim();
        if trimmed.len() > MAX_EXPRESSION {
            return Err(format!("the cron expression is longer than {MAX_EXPRESSION} characters"));
        }
        let rule = match trimmed.strip_prefix("@every") {
            Some(duration) => Rule::Every(parse_duration(duration.trim())?),
            None => Rule::Cron(Box::new(parse_cron(alias(trimmed)?)?)),
        };
        Ok(Timetable { rule, zone })
    }

    /// The first tick strictly after `after`, when `anchor` is the last
    /// tick (or the registration time): `@every` counts from it, cron
    /// expressions from `after` alone. `None` when there is none.
    pub fn next_after(&self, after: Millis, anchor: Millis) -> Option<Millis> {
        match &self.rule {
            Rule::Every(every) => {
                let anchor = anchor.min(after);
                let steps = (after - anchor) / every + 1;
                Some(anchor + steps * every)
            }
            Rule::Cron(cron) => {
                // Ticks fall on whole seconds; the search keeps the start's
                // fraction of a second, so it starts from a whole one.
                let mut start = self.zone.timestamp_millis_opt(after.div_euclid(1_000) * 1_000).single()?;
                // A time in an hour that daylight saving skips does not
                // exist: its tick is skipped, not moved past the gap (the
                // search answers the first time after the gap, which the
                // pattern does not match).
                for _ in 0..4 {
                    let next = cron.find_next_occurrence(&start, false).ok()?;
                    if cron.is_time_matching(&next).unwrap_or(false) {
                        return Some(next.timestamp_millis());
                    }
                    start = next;
                }
                None
            }
        }
    }

    /// The latest tick at or before `at`, searching back from it (cron
    /// expressions only; `@every` steps from its anchor).
    pub fn latest_at_or_before(&self, at: Millis, anchor: Millis) -> Option<Millis> {
        match &self.rule {
            Rule::Every(every) => (at >= anchor).then(|| anchor + (at - anchor) / every * every),
            Rule::Cron(cron) => {
                let start = self.zone.timestamp_millis_opt(at.div_euclid(1_000) * 1_000).single()?;
                let previous = cron.find_previous_occurrence(&start, true).ok()?;
                Some(previous.timestamp_millis())
            }
        }
    }
}

/// The five fields an alias stands for; other expressions as they are.
fn alias(expression: &str) -> Result<&str, String> {
    if !expression.starts_with('@') {
        return Ok(expression);
    }
    Ok(match expression.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        _ => {
            return Err(format!(
                "the cron expression {expression:?} is not valid: the aliases are @yearly, @annually, @monthly, \
                 @weekly, @daily, @midnight, @hourly and @every <duration>"
            ))
        }
    })
}

fn parse_cron(expression: &str) -> Result<croner::Cron, String> {
    use croner::parser::{CronParser, Seconds, Year};
    let fields = expression.split_whitespace().count();
    if !(5..=6).contains(&fields) {
        return Err(format!(
            "the cron expression {expression:?} has {fields} fields: give five (minute hour day-of-month month \
             day-of-week), six (a seconds field first), an alias such as @daily, or @every <duration>"
        ));
    }
    let cron = CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(expression)
        .map_err(|error| format!("the cron expression {expression:?} is not valid: {error}"))?;
    // A pattern that never matches (February 30th) is refused now, not
    // discovered at its first tick.
    let probe = chrono_tz::UTC.timestamp_millis_opt(0).single().expect("the epoch exists");
    if cron.find_next_occurrence(&probe, false).is_err() {
        return Err(format!("the cron expression {expression:?} never matches a date"));
    }
    Ok(cron)
}

/// `@every`'s duration: a sequence of <number><unit>, units ms, s, m, h, d
/// ("1h30m", "45s").
fn parse_duration(text: &str) -> Result<Millis, String> {
    let invalid = || format!("@every needs a duration such as 30s, 5m or 1h30m, not {text:?}");
    let mut total: Millis = 0;
    let mut rest = text;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(invalid)?;
        if digits == 0 {
            return Err(invalid());
        }
        let number: Millis = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(invalid()),
        };
        rest = &rest[unit_len..];
        total = number.checked_mul(unit).and_then(|ms| total.checked_add(ms)).ok_or_else(invalid)?;
    }
    if total < MIN_EVERY_MS {
        return Err(format!("@every {text} is shorter than a second: ticks are at least a second apart"));
    }
    Ok(total)
}

/// Whether `name` may name a schedule: 1 to [`MAX_NAME`] characters of
/// letters, digits and `-_.:`, starting with a letter or digit.
pub fn valid_schedule_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
    match ok {
        true => Ok(()),
        false => Err(format!(
            "schedule name {name:?} is not valid: 1 to {MAX_NAME} letters, digits, '-', '_', '.' or ':', \
             starting with a letter or digit"
        )),
    }
}

impl ScheduleSpec {
    /// The bytes this spec takes when encoded, within a few.
    pub fn encoded_len(&self) -> usize {
        let strings = [&self.tenant, &self.name, &self.expression, &self.timezone, &self.description];
        strings.iter().map(|s| 8 + s.len()).sum::<usize>() + self.template.encoded_len() + 16
    }

    /// Checks what the engine needs of a spec: its name, sizes and timetable.
    pub fn validate(&self) -> Result<Timetable, String> {
        valid_schedule_name(&self.name)?;
        if self.description.len() > MAX_DESCRIPTION {
            return Err(format!("the description is longer than {MAX_DESCRIPTION} bytes"));
        }
        if self.template.tenant != self.tenant {
            return Err("a schedule's job template belongs to the schedule's tenant".into());
        }
        if super::job::expires_at(&self.template).is_some() {
            return Err(
                "a schedule's job takes no expiry: a fixed one would expire every later tick's job at once".into()
            );
        }
        Timetable::parse(&self.expression, &self.timezone)
    }
}

impl Schedule {
    /// The job template of one tick: the schedule's, with the headers
    /// naming the schedule and the tick.
    pub fn job_for_tick(&self, tick: Millis) -> JobSpec {
        let mut spec = JobSpec::clone(&self.spec.template);
        spec.custom_headers.retain(|(name, _)| name != SCHEDULE_HEADER && name != TICK_HEADER);
        spec.custom_headers.push((SCHEDULE_HEADER.to_string(), self.spec.name.clone()));
        spec.custom_headers.push((TICK_HEADER.to_string(), tick.to_string()));
        spec
    }
}

/// The ticks to fire at partition time `now` for a schedule whose next tick
/// is `next_at`: the ticks to make jobs for, how many were passed over, and
/// the next tick after them. Empty while nothing is due.
pub fn due_ticks(table: &Timetable, misfire: Misfire, next_at: Millis, now: Millis) -> Due {
    let mut due = Due { ticks: Vec::new(), missed: 0, next_at };
    if next_at == 0 || next_at > now {
        return due;
    }
    match misfire {
        Misfire::FireAll => {
            let mut tick = next_at;
            while tick <= now && due.ticks.len() < MAX_TICKS_PER_ENTRY {
                due.ticks.push(tick);
                match table.next_after(tick, tick) {
                    Some(next) => tick = next,
                    None => {
                        tick = 0;
                        break;
                    }
                }
            }
            due.next_at = tick;
        }
        Misfire::FireOnce => {
            let mut latest = next_at;
            let mut passed = 0u64;
            loop {
                match table.next_after(latest, latest) {
                    Some(next) if next <= now && passed < MAX_COUNTED_MISSES => {
                        latest = next;
                        passed += 1;
                    }
                    Some(next) if next <= now => {
                        // Too many to count: jump to the latest.
                        latest = table.latest_at_or_before(now, latest).unwrap_or(next).max(latest);
                        passed += 1;
                        break;
                    }
                    _ => break,
                }
            }
            due.ticks.push(latest);
            due.missed = passed;
            due.next_at = table.next_after(latest.max(now), latest).unwrap_or(0);
        }
    }
    due
}

/// What [`due_ticks`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Due {
    pub ticks: Vec<Millis>,
    pub missed: u64,
    pub next_at: Millis,
}

/// The partition that keeps a tenant's schedule of `name`.
pub fn schedule_partition(tenant: &str, name: &str, partitions: u32) -> super::ids::PartitionId {
    let hash = super::ids::StableHash::new().part(b"schedule").part(tenant.as_bytes()).part(name.as_bytes());
    (hash.finish() % u64::from(partitions.max(1))) as super::ids::PartitionId
}
