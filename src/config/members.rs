//! Who the members are and where: the member list with its locations, this
//! node's own location, and its id from a StatefulSet's host name.

use std::collections::BTreeMap;

use anyhow::{bail, Context};

use crate::placement::Location;
use crate::raft::NodeId;

pub(super) fn node_id_from_hostname() -> anyhow::Result<NodeId> {
    let host =
        std::env::var("HOSTNAME").ok().or_else(|| std::fs::read_to_string("/etc/hostname").ok()).unwrap_or_default();
    let host = host.trim();
    let ordinal = host.rsplit('-').next().unwrap_or_default();
    ordinal.parse().with_context(|| {
        format!("host name {host:?} does not end in -N (a StatefulSet ordinal); set --node-id instead")
    })
}

/// Members as ID=HOST:PORT[@REGION[/ZONE]]: addresses and locations (all
/// empty when no entry names one; all entries or none must).
pub fn parse_members(entries: &[String]) -> anyhow::Result<(BTreeMap<NodeId, String>, BTreeMap<NodeId, Location>)> {
    parse_members_as(entries, false)
}

/// Whether `entries` (a member list, unparsed) name node `id`.
pub(super) fn lists(entries: &[String], id: NodeId) -> bool {
    entries.iter().any(|e| e.split_once('=').is_some_and(|(n, _)| n.trim().parse::<NodeId>().ok() == Some(id)))
}

/// [`parse_members`]; a node being added to a running cluster (`joining`)
/// may list any ids, as ids that left are never used again.
pub fn parse_members_as(
    entries: &[String],
    joining: bool,
) -> anyhow::Result<(BTreeMap<NodeId, String>, BTreeMap<NodeId, Location>)> {
    let mut members = BTreeMap::new();
    let mut locations = BTreeMap::new();
    for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let Some((id, rest)) = entry.split_once('=') else {
            bail!("member {entry:?} must look like ID=HOST:PORT, for example 0=drover-0.drover:26502");
        };
        let id: NodeId = id.trim().parse().with_context(|| format!("member {entry:?}: {id:?} is not a node id"))?;
        let (addr, location) = match rest.split_once('@') {
            Some((addr, location)) => {
                (addr, Location::parse(location.trim()).with_context(|| format!("member {entry:?}"))?)
            }
            None => (rest, Location::default()),
        };
        if members.insert(id, addr.trim().to_string()).is_some() {
            bail!("member id {id} appears twice in the member list");
        }
        locations.insert(id, location);
    }
    if !members.is_empty() && !joining {
        let expected: Vec<NodeId> = (0..members.len() as NodeId).collect();
        let actual: Vec<NodeId> = members.keys().copied().collect();
        if actual != expected {
            bail!("member ids must be 0..{} with none missing, got {actual:?}", members.len());
        }
    }
    let located = locations.values().filter(|l| !l.is_empty()).count();
    if located != 0 && located != locations.len() {
        bail!(
            "{located} of {} members name a location (@REGION/ZONE); give every member one, or none",
            locations.len()
        );
    }
    Ok((members, locations))
}

/// This node's location: its member entry's, which `--region` and `--zone`
/// may repeat but not contradict, or theirs alone without one.
pub(super) fn own_location(
    listed: Option<&Location>,
    region: Option<String>,
    zone: Option<String>,
) -> anyhow::Result<Location> {
    match listed.filter(|l| !l.is_empty()) {
        Some(listed) => {
            for (flag, given, listed) in [("--region", &region, &listed.region), ("--zone", &zone, &listed.zone)] {
                if let Some(given) = given.as_ref().filter(|g| *g != listed) {
                    bail!("{flag} {given:?} contradicts this node's member entry ({listed:?}); give one or make them agree");
                }
            }
            Ok(listed.clone())
        }
        None => match (region, zone) {
            (None, None) => Ok(Location::default()),
            (Some(region), None) => Location::parse(&region),
            (Some(region), Some(zone)) => Location::parse(&format!("{region}/{zone}")),
            (None, Some(_)) => bail!("--zone needs --region"),
        },
    }
}
