//! The broker's registry of aggregated job streams, as registered by gateways.
//!
//! Node-level, not per leader: a partition leader elected later finds every
//! stream already here. Gateways re-register their streams periodically; a
//! registration not refreshed within [`STREAM_TTL`] is dropped, so a gateway that
//! died without saying goodbye stops receiving pushes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::seq::IndexedRandom;
use serde::Serialize;

use crate::raft::NodeId;

/// How long a registration lives without a refresh.
pub const STREAM_TTL: Duration = Duration::from_secs(15);

/// An aggregated stream on some gateway, as a broker knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RemoteStream {
    pub gateway: NodeId,
    pub stream_id: u64,
    pub job_type: String,
    pub worker: String,
    pub timeout_ms: i64,
    /// Never empty: the default tenant when the worker named none.
    pub tenants: Vec<String>,
    pub fetch_variables: Vec<String>,
}

struct Entry {
    stream: Arc<RemoteStream>,
    refreshed: Instant,
}

#[derive(Default)]
pub struct BrokerStreams {
    by_type: Mutex<HashMap<String, Vec<Entry>>>,
}

impl BrokerStreams {
    /// Adds or refreshes a stream; true when it is new.
    pub fn register(&self, stream: RemoteStream) -> bool {
        let mut by_type = self.by_type.lock().expect("stream registry lock");
        let entries = by_type.entry(stream.job_type.clone()).or_default();
        let now = Instant::now();
        if let Some(existing) =
            entries.iter_mut().find(|e| e.stream.gateway == stream.gateway && e.stream.stream_id == stream.stream_id)
        {
            existing.refreshed = now;
            return false;
        }
        entries.push(Entry { stream: Arc::new(stream), refreshed: now });
        metrics::gauge!("drover_broker_open_job_stream_count").increment(1.0);
        true
    }

    pub fn remove(&self, gateway: NodeId, stream_id: u64) {
        let mut by_type = self.by_type.lock().expect("stream registry lock");
        for entries in by_type.values_mut() {
            let before = entries.len();
            entries.retain(|e| !(e.stream.gateway == gateway && e.stream.stream_id == stream_id));
            let removed = before - entries.len();
            if removed > 0 {
                metrics::gauge!("drover_broker_open_job_stream_count").decrement(removed as f64);
            }
        }
        by_type.retain(|_, entries| !entries.is_empty());
    }

    /// Picks a live stream for a type at random, skipping `excluded` ones.
    pub fn pick(&self, job_type: &str, excluded: impl Fn(&RemoteStream) -> bool) -> Option<Arc<RemoteStream>> {
        let mut by_type = self.by_type.lock().expect("stream registry lock");
        let entries = by_type.get_mut(job_type)?;
        let now = Instant::now();
        let before = entries.len();
        entries.retain(|e| now.duration_since(e.refreshed) < STREAM_TTL);
        let expired = before - entries.len();
        if expired > 0 {
            metrics::gauge!("drover_broker_open_job_stream_count").decrement(expired as f64);
        }
        let candidates: Vec<&Entry> = entries.iter().filter(|e| !excluded(&e.stream)).collect();
        candidates.choose(&mut rand::rng()).map(|e| Arc::clone(&e.stream))
    }

    pub fn all(&self) -> Vec<Arc<RemoteStream>> {
        let by_type = self.by_type.lock().expect("stream registry lock");
        by_type.values().flatten().map(|e| Arc::clone(&e.stream)).collect()
    }
}
