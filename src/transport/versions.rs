//! The data versions a cluster's members speak, and the cluster version: the
//! lowest of them, which is what every node writes on the wire and in
//! snapshots, so that no member reads an encoding it does not know.
//!
//! Every call between nodes carries the caller's node id and data version as
//! metadata (`drover-node`, `drover-data-version`), and every answer the
//! answering node's; a node learns each member's version from whatever it
//! last heard from it. A member not heard from yet counts as the oldest
//! version this build reads, so a node that starts among older members
//! writes their encodings until it has heard from every one of them.
//!
//! The cluster version only rises on its own: once every member has spoken a
//! version, the node records it ([`Versions::floor`], kept in its data
//! directory) and from then on refuses a peer that speaks less — an older
//! build would misread what the cluster now writes — with a message that
//! says to upgrade that node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Mutex;

use tokio::sync::watch;

use crate::codec::{DATA_VERSION, OLDEST_VERSION};
use crate::core::NodeId;

/// The metadata naming the calling (or answering) node.
pub const NODE_HEADER: &str = "drover-node";
/// The metadata naming the data version of a call's (or answer's) payloads.
pub const VERSION_HEADER: &str = "drover-data-version";

/// What this node knows of its members' data versions.
pub struct Versions {
    own: NodeId,
    /// The members (the cluster plan changes them).
    members: Mutex<Vec<NodeId>>,
    heard: Mutex<HashMap<NodeId, u16>>,
    /// The cluster version this node has recorded as reached: it never goes
    /// back below it.
    floor: AtomicU16,
    /// The cluster version as it changes.
    cluster: watch::Sender<u16>,
}

impl Versions {
    /// For node `own` among `members`, with the cluster version it recorded
    /// last (`OLDEST_VERSION` when it recorded none).
    pub fn new(own: NodeId, members: Vec<NodeId>, floor: u16) -> Versions {
        let floor = floor.clamp(OLDEST_VERSION, DATA_VERSION);
        let versions = Versions {
            own,
            members: Mutex::new(members),
            heard: Mutex::default(),
            floor: AtomicU16::new(floor),
            cluster: watch::channel(floor).0,
        };
        versions.update();
        versions
    }

    /// The members are now `members` (the cluster plan changed them).
    pub fn set_members(&self, members: Vec<NodeId>) {
        *self.members.lock().expect("versions lock") = members;
        self.update();
    }

    pub fn own_node(&self) -> NodeId {
        self.own
    }

    /// `node` spoke `version` (no version: 6, the last build without them).
    pub fn heard(&self, node: NodeId, version: Option<u16>) {
        if node == self.own || !self.members.lock().expect("versions lock").contains(&node) {
            return;
        }
        let version = version.unwrap_or(OLDEST_VERSION);
        let changed = self.heard.lock().expect("versions lock").insert(node, version) != Some(version);
        if changed {
            self.update();
        }
    }

    /// Whether `node` was last heard speaking `version` or later (a node not
    /// heard from was not).
    pub fn spoke_at_least(&self, node: NodeId, version: u16) -> bool {
        self.heard.lock().expect("versions lock").get(&node).is_some_and(|heard| *heard >= version)
    }

    /// The version every member reads, this node's own included.
    pub fn cluster_version(&self) -> u16 {
        *self.cluster.borrow()
    }

    /// The cluster version this node recorded as reached.
    pub fn floor(&self) -> u16 {
        self.floor.load(Ordering::Acquire)
    }

    /// Records that the cluster version reached `version` (it never goes back).
    pub fn raise_floor(&self, version: u16) {
        self.floor.fetch_max(version.min(DATA_VERSION), Ordering::AcqRel);
        self.update();
    }

    /// Watches the cluster version.
    pub fn watch(&self) -> watch::Receiver<u16> {
        self.cluster.subscribe()
    }

    /// Each member's version as last heard (this node's own included);
    /// `None` for a member not heard from.
    pub fn members(&self) -> Vec<(NodeId, Option<u16>)> {
        let heard = self.heard.lock().expect("versions lock");
        self.members
            .lock()
            .expect("versions lock")
            .iter()
            .map(|node| (*node, if *node == self.own { Some(DATA_VERSION) } else { heard.get(node).copied() }))
            .collect()
    }

    /// Whether a peer speaking `version` may take part: not newer than this
    /// build reads, and not older than what the cluster reached.
    pub fn admit(&self, node: Option<NodeId>, version: Option<u16>) -> Result<(), String> {
        let version = version.unwrap_or(OLDEST_VERSION);
        let who = node.map_or_else(|| "a caller that names no node".to_string(), |n| format!("node {n}"));
        if version > DATA_VERSION {
            return Err(format!(
                "{who} speaks data version {version}, newer than this node's {DATA_VERSION}: upgrade this node"
            ));
        }
        let floor = self.floor();
        if version < floor {
            return Err(format!(
                "{who} speaks data version {version}, but every member of this cluster has run version {floor} \
                 and it now writes that version's encodings, which an older build misreads: run a build of data \
                 version {floor} or later there (docs/upgrades.md)"
            ));
        }
        Ok(())
    }

    fn update(&self) {
        let heard = self.heard.lock().expect("versions lock");
        let lowest = self
            .members
            .lock()
            .expect("versions lock")
            .iter()
            .filter(|n| **n != self.own)
            .map(|n| heard.get(n).copied().unwrap_or(OLDEST_VERSION))
            .fold(DATA_VERSION, u16::min);
        let version = lowest.max(self.floor());
        self.cluster.send_if_modified(|current| {
            let changed = *current != version;
            *current = version;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_spoke_a_version_only_once_heard_speaking_it() {
        let versions = Versions::new(0, vec![0, 1, 2], 0);
        assert!(!versions.spoke_at_least(1, 7), "not heard from");
        versions.heard(1, None);
        assert!(!versions.spoke_at_least(1, 7), "a build without versions speaks 6");
        versions.heard(1, Some(7));
        assert!(versions.spoke_at_least(1, 7) && !versions.spoke_at_least(1, 8));
        versions.heard(1, None);
        assert!(!versions.spoke_at_least(1, 7), "what it last spoke counts: an older build came back");
    }

    #[test]
    fn the_cluster_version_is_the_lowest_member_s_and_never_falls_below_what_was_reached() {
        let versions = Versions::new(0, vec![0, 1, 2], 0);
        assert_eq!(versions.cluster_version(), OLDEST_VERSION, "members not heard from count as the oldest");
        versions.heard(1, Some(DATA_VERSION));
        assert_eq!(versions.cluster_version(), OLDEST_VERSION, "node 2 not heard from yet");
        versions.heard(2, None);
        assert_eq!(versions.cluster_version(), OLDEST_VERSION, "node 2 sends no version: 6");
        versions.heard(2, Some(DATA_VERSION));
        assert_eq!(versions.cluster_version(), DATA_VERSION);
        assert!(versions.admit(Some(2), None).is_ok(), "an older peer is taken while nothing was recorded");

        versions.raise_floor(DATA_VERSION);
        versions.heard(2, None);
        assert_eq!(versions.cluster_version(), DATA_VERSION, "the recorded version holds");
        let refused = versions.admit(Some(2), None).unwrap_err();
        assert!(
            refused.contains("node 2 speaks data version 6") && refused.contains("run a build of data version"),
            "{refused}"
        );
        let newer = versions.admit(Some(1), Some(DATA_VERSION + 1)).unwrap_err();
        assert!(newer.contains("newer than this node's"), "{newer}");
        versions.heard(9, Some(1));
        assert_eq!(versions.members().len(), 3, "a stranger is not a member");
    }
}
