//! Test hosts: one network namespace per node and one for the clients, joined
//! by a bridge that lives in its own namespace, so no test traffic touches the
//! machine's own network. Faults are nftables rules and `tbf` queueing
//! disciplines inside the namespaces.

use std::process::{Command, Stdio};

use anyhow::{bail, Context};

/// The subnet the suite gives its own test hosts (inside its namespaces only).
pub const SUBNET: &str = "10.231.0";

pub fn sh(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {args:?}"))?;
    if !output.status.success() {
        bail!("{args:?} failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// Runs nft with a script inside a namespace.
pub fn nft(ns: &str, script: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft")?;
    child.stdin.take().expect("piped").write_all(script.as_bytes())?;
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!("nft in {ns} failed: {}\n{script}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

pub struct Network {
    pub prefix: String,
    hosts: Vec<String>,
}

impl Network {
    pub fn node_ns(&self, i: usize) -> String {
        format!("{}-n{i}", self.prefix)
    }
    pub fn client_ns(&self) -> String {
        format!("{}-c", self.prefix)
    }
    fn switch_ns(&self) -> String {
        format!("{}-sw", self.prefix)
    }
    pub fn node_ip(&self, i: usize) -> String {
        format!("{SUBNET}.{}", i + 1)
    }
    pub fn client_ip(&self) -> String {
        format!("{SUBNET}.100")
    }

    /// A handle on namespaces created by another process (it destroys nothing).
    pub fn attach(namespaces: &[String], _ips: &[String]) -> Network {
        let prefix =
            namespaces.first().and_then(|n| n.rsplit_once('-')).map(|(p, _)| p.to_string()).unwrap_or_default();
        Network { prefix, hosts: Vec::new() }
    }

    /// Creates the namespaces, the bridge and one veth pair per host.
    pub fn create(prefix: &str, nodes: usize) -> anyhow::Result<Network> {
        let mut net = Network { prefix: prefix.to_string(), hosts: Vec::new() };
        let sw = net.switch_ns();
        sh(&["ip", "netns", "add", &sw])?;
        net.hosts.push(sw.clone());
        sh(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        sh(&["ip", "-n", &sw, "link", "set", "br0", "up"])?;
        let mut hosts: Vec<(String, String, String)> =
            (0..nodes).map(|i| (net.node_ns(i), net.node_ip(i), format!("n{i}"))).collect();
        hosts.push((net.client_ns(), net.client_ip(), "c".into()));
        for (ns, ip, short) in hosts {
            sh(&["ip", "netns", "add", &ns])?;
            net.hosts.push(ns.clone());
            // veth names are at most 15 bytes.
            let tag: String = prefix.chars().rev().take(6).collect::<String>().chars().rev().collect();
            let (a, b) = (format!("{tag}{short}a"), format!("{tag}{short}b"));
            sh(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b])?;
            sh(&["ip", "link", "set", &a, "netns", &sw])?;
            sh(&["ip", "link", "set", &b, "netns", &ns])?;
            sh(&["ip", "-n", &sw, "link", "set", &a, "master", "br0", "up"])?;
            sh(&["ip", "-n", &ns, "link", "set", &b, "name", "eth0"])?;
            sh(&["ip", "-n", &ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            sh(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// Drops packets arriving at node `i` from the given addresses.
    pub fn block(&self, i: usize, from: &[String]) -> anyhow::Result<()> {
        if from.is_empty() {
            return Ok(());
        }
        let set = from.join(", ");
        nft(
            &self.node_ns(i),
            &format!(
                "table inet drj_part {{\n chain input {{ type filter hook input priority 0; policy accept; ip saddr {{ {set} }} drop; }}\n}}\n"
            ),
        )
    }

    /// Applies a partition: every node drops what arrives from the nodes it
    /// holds a grudge against.
    pub fn partition(&self, grudge: &crate::partition::Grudge) -> anyhow::Result<()> {
        for (node, from) in grudge {
            self.block(*node, &from.iter().map(|j| self.node_ip(*j)).collect::<Vec<_>>())?;
        }
        Ok(())
    }

    /// Limits what node `i` sends to `kbit` kilobits per second (a token
    /// bucket on its interface: bursts up to 32 kbit, packets queued longer
    /// than 400 ms are dropped).
    pub fn throttle(&self, i: usize, kbit: u32) -> anyhow::Result<()> {
        let ns = self.node_ns(i);
        let rate = format!("{kbit}kbit");
        sh(&[
            "ip", "netns", "exec", &ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", &rate, "burst",
            "32kbit", "latency", "400ms",
        ])
    }

    /// Drops a random `percent` of the packets arriving at node `i`.
    pub fn lossy(&self, i: usize, percent: u32) -> anyhow::Result<()> {
        nft(
            &self.node_ns(i),
            &format!(
                "table inet drj_loss {{\n chain input {{ type filter hook input priority 0; policy accept; ip saddr {SUBNET}.0/24 numgen random mod 100 < {percent} drop; }}\n}}\n"
            ),
        )
    }

    /// Removes every fault rule and bandwidth limit from the given nodes
    /// (every node ever started: a spare slot has none).
    pub fn heal(&self, nodes: &[usize]) {
        for &i in nodes {
            for table in ["drj_part", "drj_loss"] {
                let _ = sh(&["ip", "netns", "exec", &self.node_ns(i), "nft", "delete", "table", "inet", table]);
            }
            // Fails with "no qdisc" when the node was not throttled.
            let _ = sh(&["ip", "netns", "exec", &self.node_ns(i), "tc", "qdisc", "del", "dev", "eth0", "root"]);
        }
    }

    pub fn destroy(&mut self) {
        for ns in self.hosts.drain(..).rev() {
            let _ = sh(&["ip", "netns", "del", &ns]);
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.destroy();
    }
}
