//! The faults a run injects: which comes next (seeded, in shuffled rounds so
//! a short run still sees every kind), how each is injected, and how all are
//! healed.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;
use serde::Serialize;

use crate::membership::{Change, Pending};
use crate::{cluster, net, partition, proxy, sessions, Nemesis};

/// Draws from a fixed set in shuffled rounds: each item once per round, so a
/// short run still sees every kind (time allowing) in a seeded order.
pub struct Bag<T> {
    items: Vec<T>,
    left: Vec<T>,
}

impl<T: Copy> Bag<T> {
    fn new(items: &[T]) -> Self {
        assert!(!items.is_empty(), "a bag needs items");
        Bag { items: items.to_vec(), left: Vec::new() }
    }

    pub fn next(&mut self, rng: &mut StdRng) -> T {
        if self.left.is_empty() {
            self.left = self.items.clone();
            self.left.shuffle(rng);
        }
        self.left.pop().expect("refilled")
    }
}

/// The link faults of the `badlinks` nemesis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkKind {
    Loss,
    Delay,
    Bandwidth,
}

/// How many nodes the `kill` nemesis kills.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum KillKind {
    One,
    Majority,
    All,
}

/// How the `clock` nemesis moves a node's wall clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClockKind {
    /// Ahead by a second to an hour.
    Forward,
    /// Behind by a second to an hour.
    Back,
    /// Twice as fast.
    Fast,
    /// Half as fast.
    Slow,
}

impl ClockKind {
    /// libfaketime's setting for it.
    fn spec(self, rng: &mut StdRng) -> String {
        let seconds = *[1, 5, 30, 300, 3600].choose(rng).expect("offsets");
        match self {
            ClockKind::Forward => format!("+{seconds}"),
            ClockKind::Back => format!("-{seconds}"),
            ClockKind::Fast => "+0 x2".into(),
            ClockKind::Slow => "+0 x0.5".into(),
        }
    }
}

/// Whose power the `power` nemesis cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PowerKind {
    /// One random node.
    One,
    /// A random minority (⌊(n-1)/2⌋ nodes, at least one).
    Minority,
    /// Every node at once: the power failure.
    All,
}

/// What the `corrupt` nemesis does to one file of a stopped node's database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CorruptKind {
    /// XOR 1 to 8 bytes at random offsets with random non-zero masks.
    FlipBits,
    /// Cut the file to a random length shorter than it.
    Truncate,
    /// Delete it.
    Delete,
}

/// Which of a database's files the `corrupt` nemesis damages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DbFile {
    Wal,
    Sst,
    Manifest,
}

impl DbFile {
    fn matches(self, name: &str) -> bool {
        match self {
            DbFile::Wal => name.ends_with(".log") && name.chars().next().is_some_and(|c| c.is_ascii_digit()),
            DbFile::Sst => name.ends_with(".sst"),
            DbFile::Manifest => name.starts_with("MANIFEST-"),
        }
    }
}

/// Damages `file` as `kind` says; returns what was done, for the timeline.
fn corrupt(file: &std::path::Path, kind: CorruptKind, rng: &mut StdRng) -> anyhow::Result<String> {
    let len = std::fs::metadata(file)?.len();
    Ok(match kind {
        CorruptKind::FlipBits => {
            let mut bytes = std::fs::read(file)?;
            if bytes.is_empty() {
                std::fs::remove_file(file)?;
                return Ok("was empty: deleted it".into());
            }
            let mut offsets = Vec::new();
            for _ in 0..rng.random_range(1..=8) {
                let at = rng.random_range(0..bytes.len());
                bytes[at] ^= rng.random_range(1..=255u8);
                offsets.push(at);
            }
            std::fs::write(file, &bytes)?;
            format!("flipped bits at offsets {offsets:?} of {len} bytes")
        }
        CorruptKind::Truncate => {
            let to = rng.random_range(0..len.max(1));
            std::fs::OpenOptions::new().write(true).open(file)?.set_len(to)?;
            format!("cut from {len} to {to} bytes")
        }
        CorruptKind::Delete => {
            std::fs::remove_file(file)?;
            format!("deleted ({len} bytes)")
        }
    })
}

/// How the `restart` nemesis stops a node before starting it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum RestartKind {
    /// SIGTERM: Drover's graceful shutdown (streams closed, requests finished).
    Sigterm,
    /// SIGKILL: a crash.
    Sigkill,
}

impl RestartKind {
    fn signal(self) -> i32 {
        match self {
            RestartKind::Sigterm => libc::SIGTERM,
            RestartKind::Sigkill => libc::SIGKILL,
        }
    }
}

/// How long a node may take to stop after SIGTERM before it is killed: its
/// shutdown waits for requests in flight, up to the request timeout (10 s by
/// default).
pub const GRACEFUL_STOP: Duration = Duration::from_secs(20);

/// Which nemesis, partition, kill, link fault and restart come next.
pub struct Schedule {
    pub nemeses: Bag<Nemesis>,
    /// The rolling restart's next node (in order, modulo the node count).
    rolling: usize,
    partitions: Bag<partition::Kind>,
    kills: Bag<KillKind>,
    links: Bag<LinkKind>,
    restarts: Bag<RestartKind>,
    clocks: Bag<ClockKind>,
    corruptions: Bag<CorruptKind>,
    powers: Bag<PowerKind>,
    db_files: Bag<DbFile>,
    pub memberships: Bag<Change>,
    /// A membership change whose outcome is not known yet.
    pub pending: Option<Pending>,
}

impl Schedule {
    pub fn new(nemeses: &[Nemesis]) -> Schedule {
        let mut unique: Vec<Nemesis> = Vec::new();
        for nemesis in nemeses {
            if !unique.contains(nemesis) {
                unique.push(*nemesis);
            }
        }
        Schedule {
            nemeses: Bag::new(&unique),
            partitions: Bag::new(&partition::Kind::ALL),
            // Single kills twice as often as the others.
            kills: Bag::new(&[KillKind::One, KillKind::Majority, KillKind::One, KillKind::All]),
            links: Bag::new(&[LinkKind::Loss, LinkKind::Delay, LinkKind::Bandwidth]),
            restarts: Bag::new(&[RestartKind::Sigterm, RestartKind::Sigkill]),
            clocks: Bag::new(&[ClockKind::Forward, ClockKind::Back, ClockKind::Fast, ClockKind::Slow]),
            powers: Bag::new(&[PowerKind::One, PowerKind::Minority, PowerKind::All]),
            corruptions: Bag::new(&[CorruptKind::FlipBits, CorruptKind::Truncate, CorruptKind::Delete]),
            db_files: Bag::new(&[DbFile::Wal, DbFile::Sst, DbFile::Manifest]),
            memberships: Bag::new(&Change::ALL),
            pending: None,
            rolling: 0,
        }
    }
}

/// One injected fault, as the timeline records it.
pub struct Fault {
    pub kind: String,
    pub description: String,
    pub detail: serde_json::Value,
    /// It stopped at least one node (the availability figures follow it).
    pub stops_nodes: bool,
}

impl Fault {
    pub fn new(kind: impl Serialize, description: String, detail: serde_json::Value) -> Fault {
        let kind = serde_json::to_value(kind).ok().and_then(|k| k.as_str().map(str::to_string)).unwrap_or_default();
        Fault { kind, description, detail, stops_nodes: false }
    }

    pub fn stopping_nodes(mut self) -> Fault {
        self.stops_nodes = true;
        self
    }
}

/// What the nemeses act on.
pub struct Faults<'a> {
    pub network: &'a net::Network,
    pub proxies: &'a proxy::Proxies,
    pub nodes: &'a mut cluster::Nodes,
    pub workers: &'a mut sessions::Workers,
    /// The nodes' lossy file systems, with the `power` nemesis.
    pub disks: Option<&'a cluster::LossyDisks>,
    /// Every slot's gateway, by node id.
    pub gateways: &'a [String],
    /// The `membership` nemesis is on: the members change.
    pub membership: bool,
    /// With tokens: the token plan changes send (`cluster:admin`, tenant `*`).
    pub admin_token: Option<String>,
    /// Spare slots the `membership` nemesis leaves for the `corrupt`
    /// nemesis, which replaces a node that refuses to start.
    pub reserve: usize,
    /// Membership events between faults (nodes retired and stopped), for
    /// the timeline.
    pub notes: Vec<serde_json::Value>,
}

impl Faults<'_> {
    /// Ends every fault: rules and limits removed, delays cleared, paused
    /// nodes resumed, killed nodes restarted. (A restarted node is already
    /// running again: nothing to do for it.)
    ///
    /// With the `membership` nemesis, nodes the plan retired meanwhile are
    /// stopped first (when some node is leaving), so none starts again.
    pub async fn heal(&mut self) -> anyhow::Result<()> {
        self.network.heal(&self.nodes.used());
        self.proxies.clear();
        if self.membership && !self.nodes.in_states(&[cluster::Slot::Leaving]).is_empty() {
            self.reconcile(Duration::from_secs(3)).await?;
        }
        self.nodes.heal()
    }

    pub async fn inject(
        &mut self,
        nemesis: Nemesis,
        schedule: &mut Schedule,
        rng: &mut StdRng,
    ) -> anyhow::Result<Fault> {
        // The members (every node, without the membership nemesis): what
        // faults strike. Spare and retired slots are left alone.
        let all: Vec<usize> = self.nodes.members();
        let n = all.len();
        let mut order = all.clone();
        order.shuffle(rng);
        Ok(match nemesis {
            Nemesis::Membership => self.membership(schedule, rng).await?,
            Nemesis::Workers => {
                // Killed and replaced at once: nothing to heal.
                let killed = self.workers.kill_one(rng.random_range(0..sessions::WORKERS))?;
                let description = format!("SIGKILL worker process {killed} (a new one starts)");
                Fault::new("worker-kill", description, serde_json::json!({ "worker": killed }))
            }
            Nemesis::Partition => {
                let kind = schedule.partitions.next(rng);
                let others = |x: usize| all.iter().copied().filter(|i| *i != x).collect::<Vec<_>>();
                let (grudge, description) = match kind {
                    partition::Kind::IsolateOne => {
                        let rest = others(order[0]);
                        (
                            partition::split(&[order[0]], &rest),
                            format!("isolate node {}: {:?} | {rest:?}", order[0], [order[0]]),
                        )
                    }
                    partition::Kind::Halves => {
                        let (a, b) = order.split_at(rng.random_range(1..n));
                        (partition::split(a, b), format!("halves {a:?} | {b:?}"))
                    }
                    partition::Kind::IsolateLeader => {
                        let leader = self.nodes.leader_of(0).await.unwrap_or(order[0]);
                        let rest = others(leader);
                        (
                            partition::split(&[leader], &rest),
                            format!("isolate the leader of partition 0: [{leader}] | {rest:?}"),
                        )
                    }
                    partition::Kind::Ring => {
                        let ring = order.iter().map(|i| i.to_string()).collect::<Vec<_>>().join("-");
                        let shape = if n <= 3 {
                            format!(" (on 3 nodes, a bridge through node {})", order[0])
                        } else {
                            String::new()
                        };
                        (partition::ring(&order), format!("majorities ring {ring}{shape}"))
                    }
                    partition::Kind::Bridge => {
                        let (a, b) = order[1..].split_at((n - 1) / 2);
                        (partition::bridge(&order), format!("bridge through node {}: {a:?} | {b:?}", order[0]))
                    }
                    partition::Kind::OneWay => {
                        let node = if rng.random_bool(0.5) {
                            self.nodes.leader_of(0).await.unwrap_or(order[0])
                        } else {
                            order[0]
                        };
                        let rest = others(node);
                        let from = if rng.random_bool(0.5) { rest } else { vec![*rest.choose(rng).expect("3 nodes")] };
                        (
                            partition::one_way(node, &from),
                            format!("node {node} drops packets from {from:?}; they still hear it"),
                        )
                    }
                };
                self.network.partition(&grudge)?;
                let detail = serde_json::json!({ "drops": grudge, "hears": partition::hears(&grudge, &all) });
                Fault::new(kind, description, detail)
            }
            Nemesis::Kill => {
                let kind = schedule.kills.next(rng);
                let mut victims = match kind {
                    KillKind::One => vec![order[0]],
                    KillKind::Majority => order[..n / 2 + 1].to_vec(),
                    KillKind::All => all.clone(),
                };
                victims.sort_unstable();
                for victim in &victims {
                    self.nodes.kill(*victim);
                }
                Fault::new(kind, format!("SIGKILL nodes {victims:?}"), serde_json::json!({ "nodes": victims }))
                    .stopping_nodes()
            }
            Nemesis::Pause => {
                let (kind, victim) = if rng.random_bool(0.5) {
                    ("leader", self.nodes.leader_of(0).await.unwrap_or(order[0]))
                } else {
                    ("one", order[0])
                };
                self.nodes.signal(victim, libc::SIGSTOP);
                Fault::new(kind, format!("SIGSTOP node {victim}"), serde_json::json!({ "node": victim }))
                    .stopping_nodes()
            }
            Nemesis::Restart => {
                let kind = schedule.restarts.next(rng);
                let victim = order[0];
                // The worker streams it serves at that moment (its own view).
                let streams = self.nodes.stream_clients(victim).await;
                let stopped = self.nodes.stop(victim, kind.signal(), GRACEFUL_STOP).await?;
                self.nodes.start(victim)?;
                let signal = if kind == RestartKind::Sigterm { "SIGTERM" } else { "SIGKILL" };
                let escalated = if stopped.escalated { ", then SIGKILL" } else { "" };
                let description = format!(
                    "{signal}{escalated} node {victim} ({} worker streams), exited after {} ms ({}), started again",
                    streams.map_or_else(|| "unknown".to_string(), |n| n.to_string()),
                    stopped.after.as_millis(),
                    stopped.status
                );
                let detail = serde_json::json!({
                    "node": victim, "streams": streams, "stopped_ms": stopped.after.as_millis() as u64,
                    "escalated": stopped.escalated, "status": stopped.status,
                });
                Fault::new(kind, description, detail).stopping_nodes()
            }
            Nemesis::Power => {
                let disks = self.disks.ok_or_else(|| anyhow::anyhow!("the power nemesis needs lossy disks"))?;
                // Nodes that never sync (the no-wal-sync control) lose what
                // they acknowledged only when every node loses power at once:
                // the nodes a smaller cut spares still hold it.
                let kind = if self.nodes.skip_wal_sync { PowerKind::All } else { schedule.powers.next(rng) };
                let count = match kind {
                    PowerKind::One => 1,
                    PowerKind::Minority => ((n - 1) / 2).max(1),
                    PowerKind::All => n,
                };
                let victims: Vec<usize> = order[..count].to_vec();
                // The processes die first, so nothing is synced after the
                // cut; then each machine's page cache is gone.
                for &v in &victims {
                    self.nodes.kill(v);
                }
                let mut dropped = Vec::new();
                for &v in &victims {
                    dropped.push(disks.drop_unsynced(v).await?);
                }
                let description = format!(
                    "power cut on node(s) {victims:?}: SIGKILL, then unsynced writes dropped ({}); restarted at the heal",
                    dropped.join("; ")
                );
                let detail = serde_json::json!({ "nodes": victims, "dropped": dropped });
                Fault::new(kind, description, detail).stopping_nodes()
            }
            Nemesis::Corrupt => {
                // Re-seeding needs every other replica whole: never damage a
                // node while another is still catching up.
                let waited = std::time::Instant::now();
                while !self.nodes.all_formed() {
                    if waited.elapsed() > Duration::from_secs(60) {
                        anyhow::bail!("a re-seeded node did not catch up within 60 s");
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                // With the membership nemesis: nor while replicas move (a
                // node that refuses to start is replaced, below).
                let mut unsettled = false;
                if self.membership {
                    let settled = self.wait_settled(Duration::from_secs(60)).await?;
                    unsettled = !settled.as_ref().is_some_and(crate::membership::PlanView::settled);
                }
                let kind = schedule.corruptions.next(rng);
                // A member not leaving (every node, without the membership nemesis).
                let victim =
                    *order.iter().find(|i| self.nodes.slots[**i] == cluster::Slot::Member).unwrap_or(&order[0]);
                if unsettled {
                    let description = format!(
                        "no corruption: the cluster plan did not settle within 60 s (node {victim} would have been \
                         damaged)"
                    );
                    return Ok(Fault::new(kind, description, serde_json::json!({ "node": victim, "skipped": true })));
                }
                // A graceful stop writes the memtables to table files, so
                // there are SSTs to damage; a crash leaves the WAL to replay.
                let graceful = rng.random_bool(0.5);
                let signal = if graceful { libc::SIGTERM } else { libc::SIGKILL };
                self.nodes.stop(victim, signal, GRACEFUL_STOP).await?;
                let db = self.nodes.data_dir(victim).join("db");
                let mut names: Vec<String> =
                    std::fs::read_dir(&db)?.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
                names.sort();
                let wanted = schedule.db_files.next(rng);
                let class = [wanted, DbFile::Wal, DbFile::Manifest, DbFile::Sst]
                    .into_iter()
                    .find(|c| names.iter().any(|n| c.matches(n)))
                    .ok_or_else(|| anyhow::anyhow!("node {victim}'s database has no WAL, SST or MANIFEST"))?;
                let candidates: Vec<&String> = names.iter().filter(|n| class.matches(n)).collect();
                let name = (*candidates.choose(rng).expect("one at least")).clone();
                let done = corrupt(&db.join(&name), kind, rng)?;
                let started = self.nodes.start_watching(victim, Duration::from_secs(60)).await?;
                let refused = matches!(started, cluster::Started::Refused { .. });
                let mut replaced = None;
                let (outcome, line, reseeded) = match started {
                    cluster::Started::Ready => ("started and served".to_string(), String::new(), None),
                    // Its disk is lost: with the membership nemesis a new
                    // node replaces it under a new id, as docs/membership.md
                    // says; otherwise it is re-seeded under its own.
                    cluster::Started::Refused { status, line } if self.membership => {
                        let (done, detail) = self.replace_lost(victim, schedule, rng).await?;
                        replaced = Some(detail);
                        (format!("refused to start ({status}); {done}"), line, None)
                    }
                    cluster::Started::Refused { status, line } => {
                        let aside = self.nodes.reseed(victim)?;
                        (format!("refused to start ({status}); re-seeded from its peers"), line, Some(aside))
                    }
                };
                let how = if graceful { "SIGTERM" } else { "SIGKILL" };
                let description = format!("{how} node {victim}, {class:?} {name} {done}: {outcome}");
                let detail = serde_json::json!({
                    "node": victim, "signal": how, "file": name, "class": class, "damage": done,
                    "refused": refused, "log": line,
                    "reseeded_from_empty": reseeded.map(|p| p.display().to_string()), "replaced": replaced,
                });
                Fault::new(kind, description, detail).stopping_nodes()
            }
            Nemesis::Clock => {
                let kind = schedule.clocks.next(rng);
                let victim =
                    if rng.random_bool(0.5) { self.nodes.leader_of(0).await.unwrap_or(order[0]) } else { order[0] };
                let spec = kind.spec(rng);
                self.nodes.set_clock(victim, &spec)?;
                // Half the time the node also restarts at once: a leader does
                // so as leader, and takes its time from wall clocks.
                let restarted = rng.random_bool(0.5);
                if restarted {
                    // Long enough for libfaketime to have read the new setting.
                    tokio::time::sleep(Duration::from_millis(1_200)).await;
                    self.nodes.kill(victim);
                    self.nodes.start(victim)?;
                }
                let then = if restarted { ", then SIGKILL and start it again at once" } else { "" };
                let description = format!("set node {victim}'s wall clock to {spec:?}{then}");
                let detail = serde_json::json!({ "node": victim, "clock": spec, "restarted": restarted });
                let fault = Fault::new(kind, description, detail);
                if restarted {
                    fault.stopping_nodes()
                } else {
                    fault
                }
            }
            Nemesis::Upgrade => {
                // The next node in order, as `rolling`; it starts again at
                // the heal, on the next build.
                let victim = all[schedule.rolling % n];
                schedule.rolling += 1;
                let stopped = self.nodes.stop(victim, libc::SIGTERM, GRACEFUL_STOP).await?;
                let moved = self.nodes.upgrade(victim);
                let escalated = if stopped.escalated { ", then SIGKILL" } else { "" };
                let onto = if moved { "the next build" } else { "the build it runs" };
                let description = format!(
                    "SIGTERM{escalated} node {victim} (rolling upgrade), exited after {} ms ({}); starts again at the \
                     heal on {onto} ({} of {n} nodes on it)",
                    stopped.after.as_millis(),
                    stopped.status,
                    self.nodes.upgraded()
                );
                let detail = serde_json::json!({
                    "node": victim, "stopped_ms": stopped.after.as_millis() as u64,
                    "escalated": stopped.escalated, "status": stopped.status, "upgraded": moved,
                });
                Fault::new("upgrade", description, detail).stopping_nodes()
            }
            Nemesis::Rolling => {
                // The next node in order, as an upgrade goes through a
                // StatefulSet's pods; it starts again at the heal.
                let victim = all[schedule.rolling % n];
                schedule.rolling += 1;
                let stopped = self.nodes.stop(victim, libc::SIGTERM, GRACEFUL_STOP).await?;
                let escalated = if stopped.escalated { ", then SIGKILL" } else { "" };
                let description = format!(
                    "SIGTERM{escalated} node {victim} (rolling restart), exited after {} ms ({}); starts again at the heal",
                    stopped.after.as_millis(),
                    stopped.status
                );
                let detail = serde_json::json!({
                    "node": victim, "stopped_ms": stopped.after.as_millis() as u64,
                    "escalated": stopped.escalated, "status": stopped.status,
                });
                Fault::new("sigterm", description, detail).stopping_nodes()
            }
            Nemesis::Badlinks => {
                let kind = schedule.links.next(rng);
                let victim = order[0];
                match kind {
                    LinkKind::Loss => {
                        let percent = rng.random_range(10..40);
                        self.network.lossy(victim, percent)?;
                        let detail = serde_json::json!({ "node": victim, "percent": percent });
                        Fault::new(kind, format!("drop {percent}% of packets into node {victim}"), detail)
                    }
                    LinkKind::Delay => {
                        let base = rng.random_range(10..=300);
                        let jitter = rng.random_range(0..=100);
                        let one = rng.random_bool(0.5);
                        let delays: proxy::Delays = all
                            .iter()
                            .flat_map(|a| all.iter().map(move |b| (*a, *b)))
                            .filter(|(a, b)| a != b && (!one || *a == victim))
                            .map(|link| (link, base))
                            .collect();
                        self.proxies.delay(&delays, jitter)?;
                        let whose = if one { format!("from node {victim}") } else { "between all nodes".to_string() };
                        let detail = serde_json::json!({
                            "from": if one { vec![victim] } else { all.clone() }, "base_ms": base, "jitter_ms": jitter,
                        });
                        Fault::new(kind, format!("delay {base} ms + up to {jitter} ms jitter on links {whose}"), detail)
                    }
                    LinkKind::Bandwidth => {
                        let kbit = rng.random_range(256..=2048);
                        self.network.throttle(victim, kbit)?;
                        let detail = serde_json::json!({ "node": victim, "kbit": kbit });
                        Fault::new(kind, format!("limit node {victim} to {kbit} kbit/s out"), detail)
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_bag_gives_every_item_once_per_round() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut bag = Bag::new(&[LinkKind::Loss, LinkKind::Delay, LinkKind::Bandwidth]);
        for _ in 0..10 {
            let mut round: Vec<String> = (0..3).map(|_| format!("{:?}", bag.next(&mut rng))).collect();
            round.sort();
            assert_eq!(round, ["Bandwidth", "Delay", "Loss"]);
        }
    }

    #[test]
    fn a_schedule_names_each_nemesis_once() {
        let schedule = Schedule::new(&[Nemesis::Kill, Nemesis::Partition, Nemesis::Kill]);
        assert_eq!(schedule.nemeses.items, [Nemesis::Kill, Nemesis::Partition]);
    }
}
