//! OJS's `options.rate_limit`: a job declares its queue's limit (the
//! queue's own, or with a key each key's), and the enqueue sets it on the
//! queue before the job is made, when it is not the queue's limit already.
//! Setting it is managing the queue: it needs `jobs:manage:<queue>`, as
//! `drover queue limit` does; an enqueue that declares the limit the queue
//! has needs only `jobs:create`.

use std::time::{Duration, Instant};

use super::envelope::DeclaredLimit;
use super::{Ojs, OjsCall, OjsError};
use crate::core::limit::limit_home;
use crate::gateway::limits;
use crate::proto::gateway as pb;

/// How long this gateway trusts the limit it last saw a queue have.
const KNOWN_FOR: Duration = Duration::from_secs(5);

/// The limits this gateway last saw, by (tenant, queue).
pub(super) type Known = std::collections::HashMap<(String, String), (pb::QueueLimit, Instant)>;

impl Ojs {
    /// Makes `declared` the limit of `queue` (merged with the level it does
    /// not name), unless it is already.
    pub(super) async fn declare_limit(
        &self,
        call: &OjsCall,
        queue: &str,
        declared: &DeclaredLimit,
    ) -> Result<(), OjsError> {
        let tenant = call.scope();
        let name = (tenant.clone(), queue.to_string());
        let known = {
            let known = self.limits.lock().expect("limits lock");
            known.get(&name).filter(|(_, at)| at.elapsed() < KNOWN_FOR).map(|(limit, _)| *limit)
        };
        let current = match known {
            Some(limit) => Some(limit),
            None => {
                limits::require_cluster_version(&self.ctx).map_err(OjsError::from)?;
                let states =
                    limits::states(&self.ctx, Some(&call.principal), vec![tenant.clone()], queue, call).await?;
                states.first().map(|s| limits::to_proto(&s.limit))
            }
        };
        let mut wanted = current.unwrap_or_default();
        if declared.per_key {
            wanted.per_key = Some(declared.level);
        } else {
            wanted.queue = Some(declared.level);
        }
        if current.as_ref() != Some(&wanted) {
            let home = limit_home(&tenant, queue, self.ctx.topology.partition_count());
            let limit = limits::from_proto(wanted, home)?;
            // Stored as the limit reads back: defaults filled in.
            wanted = limits::to_proto(&limit);
            if current.as_ref() != Some(&wanted) {
                crate::auth::audit(
                    &call.principal,
                    "limit_queue",
                    serde_json::json!({"type": queue, "tenant": tenant, "limit": format!("{limit:?}"), "via": "ojs"}),
                );
                limits::set_everywhere(&self.ctx, Some(&call.principal), &tenant, queue, Some(limit), call).await?;
            }
        }
        self.limits.lock().expect("limits lock").insert(name, (wanted, Instant::now()));
        Ok(())
    }
}
