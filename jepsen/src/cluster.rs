//! `drover serve` processes, one per node namespace.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

/// What a node slot is. Slot `i` is node id `i`, and an id serves one node
/// at most: a slot that leaves never starts again. Without the `membership`
/// nemesis every slot is a member for the whole run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Slot {
    /// Never started: a node the `membership` nemesis may add.
    Spare,
    /// Started with `--join-plan`; the plan does not list it (yet).
    Joining,
    /// A member of the cluster plan.
    Member,
    /// Removed: a member still, its replicas moving away; stopped once the
    /// plan retires it.
    Leaving,
    /// Gone for good (retired by the plan, replaced, or never added): never
    /// started again.
    Retired,
}

pub struct Nodes {
    pub drover: PathBuf,
    /// The build the upgrade nemesis moves nodes to.
    pub next: Option<PathBuf>,
    /// Nodes moved to `next`: they start on it from now on.
    upgraded: Vec<bool>,
    pub dir: PathBuf,
    pub ips: Vec<String>,
    pub namespaces: Vec<String>,
    pub partitions: u32,
    pub children: Vec<Option<Child>>,
    pub paused: Vec<bool>,
    /// With TLS on every port: the directory of the run's CA and node
    /// certificate (`drover dev-certificates`), and the CA's PEM.
    pub tls: Option<(PathBuf, Vec<u8>)>,
    /// With tokens on: the token admin reads send (the tokens file is next
    /// to it in the run directory).
    pub token: Option<String>,
    /// With clock faults: every node runs under libfaketime, its wall clock
    /// (not its monotonic clock) following `clock-<i>` in the run directory.
    pub clocks: bool,
    /// Nodes whose clock runs at a faulted rate: libfaketime cannot take
    /// back the time a rate accumulated, so the heal restarts them.
    pub rated: Vec<bool>,
    /// Nodes re-seeded from their peers: they start with `--join-existing`
    /// (harmless once they have joined).
    pub joining: Vec<bool>,
    /// Re-seeds so far, naming each damaged directory kept aside.
    pub reseeds: usize,
    /// Test only: nodes never sync their WAL (`DROVER_FAILPOINT_SKIP_WAL_SYNC`),
    /// to show the power nemesis finds lost writes.
    pub skip_wal_sync: bool,
    /// Test only: `DROVER_FAILPOINTS` for every node alike (a negative
    /// control's planted bug; see `src/failpoints.rs`).
    pub failpoints: Option<String>,
    /// Each node's REGION/ZONE, named in the member list (none: empty).
    pub locations: Vec<String>,
    /// The members the cluster formed with: ids `0..original`, named in
    /// the member list of every node not started with `--join-plan`.
    pub original: usize,
    /// What each slot is (see [`Slot`]).
    pub slots: Vec<Slot>,
    /// Nodes started with `--join-plan`: the member ids their `--members`
    /// names (themselves among them); empty for the original members.
    pub join_members: Vec<Vec<usize>>,
    /// The members whose gateways clients use, kept in step with `slots`.
    pub live: Arc<crate::workload::Live>,
}

/// Every node's data directory on a file system of its own that loses what
/// was not synced when told to (`lossyfs.rs`), for the `power` nemesis.
/// Dropping it unmounts them (the nodes must be stopped first).
pub struct LossyDisks {
    children: Vec<Child>,
    controls: Vec<PathBuf>,
}

impl LossyDisks {
    /// Mounts one file system on each of `mounts` (created if missing) and
    /// waits until each answers on its control socket.
    pub async fn mount(runner: &Path, dir: &Path, mounts: &[PathBuf]) -> anyhow::Result<LossyDisks> {
        let mut disks = LossyDisks { children: Vec::new(), controls: Vec::new() };
        for (i, mount) in mounts.iter().enumerate() {
            std::fs::create_dir_all(mount)?;
            // Not in the run directory: a socket's path must fit in 108 bytes.
            let control = std::env::temp_dir().join(format!("drover-lossyfs-{}-{i}.sock", std::process::id()));
            let log =
                std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("lossyfs-{i}.log")))?;
            let mut command = Command::new(runner);
            // Dies with the run; its mount then fails every access, harmlessly.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
                    Ok(())
                });
            }
            let child = command
                .arg("lossyfs")
                .arg("--mount")
                .arg(mount)
                .arg("--control")
                .arg(&control)
                .stdin(std::process::Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting lossyfs")?;
            disks.children.push(child);
            disks.controls.push(control);
        }
        for i in 0..mounts.len() {
            let started = Instant::now();
            while disks.stats(i).await.is_err() {
                if started.elapsed() > Duration::from_secs(10) {
                    anyhow::bail!("lossyfs for node {i} did not mount within 10 s; see lossyfs-{i}.log");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(disks)
    }

    /// Loses everything node `i` wrote and did not sync; its answer line.
    pub async fn drop_unsynced(&self, i: usize) -> anyhow::Result<String> {
        crate::lossyfs::command(&self.controls[i], "drop").await
    }

    pub async fn stats(&self, i: usize) -> anyhow::Result<String> {
        crate::lossyfs::command(&self.controls[i], "stats").await
    }
}

impl Drop for LossyDisks {
    /// SIGTERM unmounts each file system; its contents go with it.
    fn drop(&mut self) {
        for child in &mut self.children {
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
        }
        for child in &mut self.children {
            let _ = child.wait();
        }
    }
}

/// How a node started after its data was damaged.
#[derive(Debug)]
pub enum Started {
    /// It answered `/ready`.
    Ready,
    /// It exited: its status and the last error line of its log.
    Refused { status: String, line: String },
}

impl Nodes {
    /// Nodes in every slot of `ips`, the first `members` of them the
    /// cluster's members (the others spare).
    pub fn from_parts(
        drover: &Path,
        dir: &Path,
        (namespaces, ips): (&[String], &[String]),
        members: usize,
        partitions: u32,
    ) -> Nodes {
        let n = ips.len();
        Nodes {
            drover: drover.to_path_buf(),
            next: None,
            upgraded: vec![false; n],
            dir: dir.to_path_buf(),
            ips: ips.to_vec(),
            namespaces: namespaces.to_vec(),
            partitions,
            children: (0..n).map(|_| None).collect(),
            paused: vec![false; n],
            tls: None,
            token: None,
            clocks: false,
            rated: vec![false; n],
            joining: vec![false; n],
            reseeds: 0,
            skip_wal_sync: false,
            failpoints: None,
            locations: Vec::new(),
            original: members,
            slots: (0..n).map(|i| if i < members { Slot::Member } else { Slot::Spare }).collect(),
            join_members: vec![Vec::new(); n],
            live: Arc::new(crate::workload::Live::new((0..members.min(n)).collect())),
        }
    }

    /// The slots in `states`, in id order.
    pub fn in_states(&self, states: &[Slot]) -> Vec<usize> {
        (0..self.slots.len()).filter(|i| states.contains(&self.slots[*i])).collect()
    }

    /// The members (leaving ones too: they hold replicas until they
    /// retire): what faults strike, what is waited for and read.
    pub fn members(&self) -> Vec<usize> {
        self.in_states(&[Slot::Member, Slot::Leaving])
    }

    /// The nodes that should be running: the members and nodes joining.
    pub fn active(&self) -> Vec<usize> {
        self.in_states(&[Slot::Joining, Slot::Member, Slot::Leaving])
    }

    /// Slots ever started (not spare).
    pub fn used(&self) -> Vec<usize> {
        (0..self.slots.len()).filter(|i| self.slots[*i] != Slot::Spare).collect()
    }

    /// Slot `i` is now `slot`; clients use the members' gateways.
    pub fn set_slot(&mut self, i: usize, slot: Slot) {
        self.slots[i] = slot;
        self.live.set(self.in_states(&[Slot::Member]));
    }

    /// The gateways of the members clients use, in id order.
    pub fn live_gateways(&self, gateways: &[String]) -> Vec<String> {
        self.live.ids().into_iter().filter_map(|i| gateways.get(i).cloned()).collect()
    }

    /// Starts spare slot `i` as a node to be added, with `--join-plan` and
    /// a member list naming `members` (itself among them).
    pub fn join(&mut self, i: usize, members: &[usize]) -> anyhow::Result<()> {
        anyhow::ensure!(self.slots[i] == Slot::Spare, "slot {i} is {:?}, not spare", self.slots[i]);
        let mut members = members.to_vec();
        members.push(i);
        members.sort_unstable();
        members.dedup();
        self.join_members[i] = members;
        self.set_slot(i, Slot::Joining);
        self.start(i)
    }

    /// Node `i` leaves for good: stopped (SIGTERM, SIGKILL after `grace`),
    /// never started again.
    pub async fn retire(&mut self, i: usize, grace: Duration) -> anyhow::Result<Option<Stopped>> {
        self.set_slot(i, Slot::Retired);
        if !self.running(i) {
            return Ok(None);
        }
        Ok(Some(self.stop(i, libc::SIGTERM, grace).await?))
    }

    /// Deletes everything in stopped node `i`'s data directory (its disk is
    /// lost); the directory stays, as it may be a mount.
    pub fn wipe(&mut self, i: usize) -> anyhow::Result<u64> {
        anyhow::ensure!(!self.running(i), "node {i} must be stopped to wipe it");
        let mut bytes = 0;
        let Ok(entries) = std::fs::read_dir(self.data_dir(i)) else { return Ok(0) };
        for entry in entries {
            let path = entry?.path();
            if path.is_dir() {
                bytes += dir_size(&path);
                std::fs::remove_dir_all(&path)?;
            } else {
                bytes += std::fs::metadata(&path).map_or(0, |m| m.len());
                std::fs::remove_file(&path)?;
            }
        }
        Ok(bytes)
    }

    fn clock_file(&self, i: usize) -> PathBuf {
        self.dir.join(format!("clock-{i}"))
    }

    /// Sets node `i`'s wall clock to libfaketime's `spec` (`+0`, `-3600`,
    /// `+0 x2`, ...): written whole and renamed, read by the node within a
    /// second.
    pub fn set_clock(&mut self, i: usize, spec: &str) -> anyhow::Result<()> {
        self.rated[i] = spec.contains('x');
        let file = self.clock_file(i);
        let next = file.with_extension("next");
        std::fs::write(&next, format!("{spec}\n"))?;
        std::fs::rename(&next, &file)?;
        Ok(())
    }

    pub fn admin(&self, i: usize) -> String {
        format!("{}:9600", self.ips[i])
    }

    /// TLS on all three ports (mutual between nodes), with the run's certificates.
    fn tls_args(&self) -> Vec<String> {
        let Some((dir, _)) = &self.tls else { return Vec::new() };
        let (cert, key, ca) = (dir.join("node.pem"), dir.join("node-key.pem"), dir.join("ca.pem"));
        let (cert, key, ca) = (cert.display().to_string(), key.display().to_string(), ca.display().to_string());
        vec![
            "--tls-cert".into(),
            cert.clone(),
            "--tls-key".into(),
            key.clone(),
            "--cluster-tls-cert".into(),
            cert,
            "--cluster-tls-key".into(),
            key,
            "--cluster-tls-ca".into(),
            ca,
        ]
    }

    /// A GET on node `i`'s admin port: over HTTPS with TLS, with the token
    /// when tokens are on.
    pub async fn admin_get(&self, i: usize, path: &str) -> std::io::Result<(u16, String)> {
        self.admin_get_as(i, path, self.token.as_deref()).await
    }

    /// Like [`Nodes::admin_get`], sending `token` instead.
    pub async fn admin_get_as(&self, i: usize, path: &str, token: Option<&str>) -> std::io::Result<(u16, String)> {
        let ca = self.tls.as_ref().map(|(_, ca)| ca.as_slice());
        http_as(&self.admin(i), "GET", path, "", ca, token).await
    }

    fn token_args(&self) -> Vec<String> {
        match &self.token {
            Some(_) => vec![
                "--tokens-file".into(),
                self.dir.join("tokens.toml").display().to_string(),
                "--job-token-key".into(),
                self.dir.join("job-token.key").display().to_string(),
            ],
            None => Vec::new(),
        }
    }

    /// The build node `i` runs: the next one once it was upgraded.
    fn binary(&self, i: usize) -> &Path {
        match &self.next {
            Some(next) if self.upgraded[i] => next,
            _ => &self.drover,
        }
    }

    /// Node `i` starts on the next build from now on; false when it already
    /// runs it (or there is none).
    pub fn upgrade(&mut self, i: usize) -> bool {
        if self.next.is_none() || self.upgraded[i] {
            return false;
        }
        self.upgraded[i] = true;
        true
    }

    /// How many nodes run the next build.
    pub fn upgraded(&self) -> usize {
        self.upgraded.iter().filter(|u| **u).count()
    }

    pub fn start(&mut self, i: usize) -> anyhow::Result<()> {
        // Peers are dialled through this node's proxy (see `proxy.rs`); the
        // node still listens on its own address.
        // The original members name the members the cluster formed with; a
        // node added later those it was given when it joined.
        let ids: Vec<usize> = match self.join_members[i].is_empty() {
            true => (0..self.original).collect(),
            false => self.join_members[i].clone(),
        };
        let members: Vec<String> = ids
            .into_iter()
            .map(|id| match self.locations.get(id) {
                Some(at) => format!("{id}={}@{at}", crate::proxy::member_addr(id)),
                None => format!("{id}={}", crate::proxy::member_addr(id)),
            })
            .collect();
        let profile: &[&str] = if self.locations.is_empty() { &[] } else { &["--network-profile", "wan"] };
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("node-{i}.log")))?;
        let mut command = Command::new("ip");
        // A node dies with the run (the signal survives the exec of `ip netns
        // exec` and of drover), so a killed run leaves no node behind.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
                Ok(())
            });
        }
        let child = command
            .args(["netns", "exec", &self.namespaces[i]])
            .arg(self.binary(i))
            .arg("serve")
            .args(["--node-id", &i.to_string()])
            .args(["--members", &members.join(",")])
            .args(["--partitions", &self.partitions.to_string()])
            .args(["--replication-factor", &crate::membership::replication_factor(self.original).to_string()])
            .args(["--grpc-addr", &format!("{}:26500", self.ips[i])])
            .args(["--cluster-addr", &format!("{}:26502", self.ips[i])])
            .args(["--admin-addr", &format!("{}:9600", self.ips[i])])
            .args(["--ojs-addr", &format!("{}:{OJS_PORT}", self.ips[i])])
            .args(profile)
            // Default Raft timing (what users run); frequent snapshots so
            // restarted nodes catch up by installing one.
            .args(["--snapshot-every", "200"])
            // The checker reads every job back after the drain: keep them all.
            .args(["--finished-retention-secs", "86400", "--finished-retention-jobs", "100000000"])
            .args(self.tls_args())
            .args(self.token_args())
            .args(if self.joining[i] { &["--join-existing"][..] } else { &[] })
            .args(if self.join_members[i].is_empty() { &[][..] } else { &["--join-plan"] })
            .arg("--data-dir")
            .arg(self.dir.join(format!("node-{i}")))
            .env("RUST_LOG", "warn,drover=info")
            .envs(self.clock_env(i)?)
            .envs(self.skip_wal_sync.then_some(("DROVER_FAILPOINT_SKIP_WAL_SYNC", "1")))
            .envs(self.failpoints.as_ref().map(|spec| ("DROVER_FAILPOINTS", spec)))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting a node")?;
        self.children[i] = Some(child);
        self.paused[i] = false;
        Ok(())
    }

    /// libfaketime's environment for node `i`, with clock faults on.
    fn clock_env(&self, i: usize) -> anyhow::Result<Vec<(&'static str, String)>> {
        if !self.clocks {
            return Ok(Vec::new());
        }
        if !self.clock_file(i).exists() {
            std::fs::write(self.clock_file(i), "+0\n")?;
        }
        let mut env = crate::faketime::env(&self.clock_file(i))?;
        env.extend([
            ("FAKETIME_CACHE_DURATION", "1".to_string()),
            // A rate change starts from the time it is made, not from the start.
            ("FAKETIME_XRESET", "1".to_string()),
        ]);
        Ok(env)
    }

    pub fn signal(&mut self, i: usize, signal: i32) {
        if let Some(child) = &self.children[i] {
            unsafe {
                libc::kill(child.id() as i32, signal);
            }
        }
        match signal {
            libc::SIGSTOP => self.paused[i] = true,
            libc::SIGCONT => self.paused[i] = false,
            _ => {}
        }
    }

    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.children[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused[i] = false;
    }

    /// Sends `signal` to node `i` and waits for the process to exit. A node
    /// that outlives `grace` is sent SIGKILL. Returns how it ended.
    pub async fn stop(&mut self, i: usize, signal: i32, grace: Duration) -> anyhow::Result<Stopped> {
        if self.paused[i] {
            self.signal(i, libc::SIGCONT);
        }
        let Some(mut child) = self.children[i].take() else {
            anyhow::bail!("node {i} is not running");
        };
        let pid = child.id() as i32;
        let started = Instant::now();
        unsafe {
            libc::kill(pid, signal);
        }
        let mut exited = tokio::task::spawn_blocking(move || child.wait());
        let (status, escalated) = match tokio::time::timeout(grace, &mut exited).await {
            Ok(status) => (status, false),
            Err(_) => {
                // Still running: the child is not reaped yet, so the pid is still ours.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
                let status = tokio::time::timeout(Duration::from_secs(10), exited)
                    .await
                    .with_context(|| format!("node {i} (pid {pid}) did not exit 10 s after SIGKILL"))?;
                (status, true)
            }
        };
        let status = status.context("waiting for a node")?.context("waiting for a node")?;
        self.paused[i] = false;
        Ok(Stopped { after: started.elapsed(), escalated, status: status.to_string() })
    }

    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("node-{i}"))
    }

    /// Starts node `i` and waits until it is ready or has exited.
    pub async fn start_watching(&mut self, i: usize, limit: Duration) -> anyhow::Result<Started> {
        let log = self.dir.join(format!("node-{i}.log"));
        let logged = std::fs::metadata(&log).map_or(0, |m| m.len());
        self.start(i)?;
        let started = Instant::now();
        loop {
            let child = self.children[i].as_mut().expect("just started");
            if let Some(status) = child.try_wait()? {
                self.children[i] = None;
                let text = std::fs::read(&log).unwrap_or_default();
                let tail = String::from_utf8_lossy(&text[(logged as usize).min(text.len())..]).into_owned();
                // The reason, as the operator reads it: the first cause
                // that names the damage, or else the error itself.
                let line = tail
                    .lines()
                    .find(|l| l.contains("damaged") || l.contains("refuse"))
                    .or_else(|| tail.lines().find(|l| l.starts_with("Error:")))
                    .unwrap_or("");
                return Ok(Started::Refused { status: status.to_string(), line: line.trim().to_string() });
            }
            if matches!(self.admin_get(i, "/ready").await, Ok((200, _))) {
                return Ok(Started::Ready);
            }
            if started.elapsed() > limit {
                anyhow::bail!("node {i} neither became ready nor exited within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Re-seeds stopped node `i` as docs/operations.md says: its data
    /// directory's contents move aside (`node-i.damaged-K`), and it starts
    /// with `--join-existing` on the empty directory.
    pub fn reseed(&mut self, i: usize) -> anyhow::Result<PathBuf> {
        anyhow::ensure!(!self.running(i), "node {i} must be stopped to re-seed it");
        self.reseeds += 1;
        let aside = self.dir.join(format!("node-{i}.damaged-{}", self.reseeds));
        std::fs::create_dir_all(&aside)?;
        for entry in std::fs::read_dir(self.data_dir(i))? {
            let entry = entry?;
            let target = aside.join(entry.file_name());
            if std::fs::rename(entry.path(), &target).is_err() {
                // Another file system (the data directory is a mount): drop it.
                let path = entry.path();
                if path.is_dir() {
                    std::fs::remove_dir_all(&path)?;
                } else {
                    std::fs::remove_file(&path)?;
                }
            }
        }
        self.joining[i] = true;
        self.start(i)?;
        Ok(aside)
    }

    /// Whether every node's data directory records that it formed or joined
    /// its groups (`cluster.json`), so none is still catching up.
    pub fn all_formed(&self) -> bool {
        self.members().into_iter().all(|i| {
            std::fs::read_to_string(self.data_dir(i).join("cluster.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .is_some_and(|v| v["formation"] == "formed")
        })
    }

    pub fn running(&self, i: usize) -> bool {
        self.children[i].is_some()
    }

    /// Resumes paused nodes, restarts killed ones, and sets every clock
    /// right; spare and retired slots stay down.
    pub fn heal(&mut self) -> anyhow::Result<()> {
        for i in self.active() {
            if self.clocks {
                if self.rated[i] && self.running(i) {
                    // SIGKILL then start: the new process's clock starts right.
                    self.kill(i);
                }
                self.set_clock(i, "+0")?;
            }
            if self.paused[i] {
                self.signal(i, libc::SIGCONT);
            }
            if !self.running(i) {
                self.start(i)?;
            }
        }
        Ok(())
    }

    pub async fn wait_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        for i in self.members() {
            while self.admin_get(i, "/ready").await.map(|(c, _)| c != 200).unwrap_or(true) {
                if started.elapsed() > limit {
                    anyhow::bail!("node {i} not ready within {limit:?}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// The node leading `partition`, by the nodes' own reports.
    pub async fn leader_of(&self, partition: u32) -> Option<usize> {
        for i in self.members() {
            if !self.running(i) || self.paused[i] {
                continue;
            }
            let Ok((200, body)) = self.admin_get(i, "/actuator/partitions").await else { continue };
            let value: serde_json::Value = serde_json::from_str(&body).ok()?;
            for p in value["local"].as_array().into_iter().flatten() {
                if p["partition"].as_u64() == Some(partition as u64) && p["role"] == "leader" {
                    return Some(i);
                }
            }
        }
        None
    }

    /// How many worker streams node `i`'s gateway serves, by its own report.
    pub async fn stream_clients(&self, i: usize) -> Option<usize> {
        let Ok((200, body)) = self.admin_get(i, "/actuator/jobstreams").await else { return None };
        let value: serde_json::Value = serde_json::from_str(&body).ok()?;
        let streams = value["client"].as_array()?;
        Some(streams.iter().map(|s| s["clients"].as_array().map_or(0, Vec::len)).sum())
    }

    pub fn stop_all(&mut self) {
        for i in 0..self.children.len() {
            if self.paused[i] {
                self.signal(i, libc::SIGCONT);
            }
            self.kill(i);
        }
    }
}

/// The bytes of the files under `dir`.
fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// How a stopped node ended.
#[derive(Debug)]
pub struct Stopped {
    /// From the signal to the exit.
    pub after: Duration,
    /// It outlived its grace period and was killed.
    pub escalated: bool,
    /// Its exit status, as the system describes it.
    pub status: String,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// A request to `addr` (a GET, or a POST of the URL-encoded `form`): over
/// TLS trusting the PEM CA `ca` when there is one, sending `token` (if any)
/// as a bearer token. Returns the status and the body.
/// The port each node serves the Open Job Spec's HTTP binding on.
pub const OJS_PORT: u16 = 8080;

pub async fn http_as(
    addr: &str,
    method: &str,
    path: &str,
    form: &str,
    ca: Option<&[u8]>,
    token: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let Some(ca) = ca else {
        let connect = tokio::net::TcpStream::connect(addr);
        let stream = tokio::time::timeout(Duration::from_secs(2), connect)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
        return request_over(stream, addr, (method, path, form), token).await;
    };
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        roots.add(cert.map_err(|e| invalid(e.to_string()))?).map_err(|e| invalid(e.to_string()))?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host).to_string();
    let name = ServerName::try_from(host).map_err(|e| invalid(e.to_string()))?;
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await
    };
    let stream = tokio::time::timeout(Duration::from_secs(2), handshake)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS connect timed out"))??;
    request_over(stream, addr, (method, path, form), token).await
}

async fn request_over(
    mut stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    addr: &str,
    (method, path, form): (&str, &str, &str),
    token: Option<&str>,
) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let body = match method {
        "GET" => String::new(),
        _ => format!("Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n", form.len()),
    };
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{authorization}{body}Connection: close\r\n\r\n{form}");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "read timed out"))?;
    // A TLS peer may close without close_notify; what arrived still counts.
    if let (Err(e), true) = (read, response.is_empty()) {
        return Err(e);
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((code, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(slots: usize, members: usize) -> Nodes {
        let names: Vec<String> = (0..slots).map(|i| format!("n{i}")).collect();
        Nodes::from_parts(Path::new("drover"), Path::new("/nonexistent"), (&names, &names), members, 3)
    }

    #[test]
    fn without_spares_every_node_is_a_member_for_good() {
        let nodes = nodes(3, 3);
        assert_eq!(nodes.members(), [0, 1, 2]);
        assert_eq!(nodes.active(), [0, 1, 2]);
        assert_eq!(nodes.live.ids(), [0, 1, 2]);
    }

    #[test]
    fn spare_and_retired_slots_are_neither_struck_nor_started_nor_read() {
        let mut nodes = nodes(9, 3);
        assert_eq!(nodes.members(), [0, 1, 2]);
        assert!(nodes.used() == [0, 1, 2] && nodes.in_states(&[Slot::Spare]) == [3, 4, 5, 6, 7, 8]);
        nodes.set_slot(3, Slot::Joining);
        // Joining: started (restarted at a heal), not yet struck by faults nor used by clients.
        assert_eq!(nodes.members(), [0, 1, 2]);
        assert_eq!(nodes.active(), [0, 1, 2, 3]);
        nodes.set_slot(3, Slot::Member);
        nodes.set_slot(0, Slot::Leaving);
        nodes.set_slot(1, Slot::Retired);
        // A leaving node still holds replicas: faults strike it, clients no longer prefer it.
        assert_eq!(nodes.members(), [0, 2, 3]);
        assert_eq!(nodes.active(), [0, 2, 3]);
        assert_eq!(nodes.live.ids(), [2, 3]);
        assert_eq!(nodes.used(), [0, 1, 2, 3]);
        let gateways: Vec<String> = (0..9).map(|i| format!("g{i}")).collect();
        assert_eq!(nodes.live_gateways(&gateways), ["g2", "g3"]);
    }

    #[test]
    fn only_a_spare_slot_joins() {
        let mut nodes = nodes(5, 3);
        nodes.set_slot(3, Slot::Retired);
        assert!(nodes.join(3, &[0, 1, 2]).is_err(), "an id is used once");
        assert!(nodes.join(1, &[0, 1, 2]).is_err());
    }
}
