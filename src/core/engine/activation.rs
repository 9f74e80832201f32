//! Activations on one partition: the jobs a poll or a push takes, best
//! first (priority, then age), over the ready queues its taker may serve,
//! within the worker's session, the message's bytes and the queues' limits.

use std::sync::Arc;

use super::sessions::unknown_session;
use super::{queues, ApplyOutput, PartitionState, QueueKey};
use crate::core::{
    ActivatedJobData, Activation, CommandError, CommandResult, EventKind, JobKey, JobState, Lifecycle, Outcome, Tally,
};

impl PartitionState {
    /// Activates jobs for a poll or a push, unless the worker's session is
    /// unknown here (refused) or takes no jobs now (none).
    pub(super) fn activate_for(
        &mut self,
        activation: &Activation,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        if activation.session != 0 {
            match self.sessions.get(&activation.session) {
                None => return Err(unknown_session(activation.session)),
                Some(session) if !session.takes_jobs() => return Ok(CommandResult::Activated(Vec::new())),
                Some(_) => {}
            }
        }
        if !self.limit_active.is_empty() {
            // Slots this batch freed so far are free for this activation.
            self.release_slots(out);
        }
        Ok(CommandResult::Activated(self.activate(activation, out)))
    }

    pub(super) fn activate(&mut self, activation: &Activation, out: &mut ApplyOutput) -> Vec<ActivatedJobData> {
        let mut activated = Vec::new();
        let taker_timeout_ms = activation.timeout_ms.max(1);
        let mut bytes = 0u64;
        // The queues this taker may serve, decided once per queue.
        let mut queues: Vec<QueueKey> = self.ready.get(&activation.job_type).map_or_else(Vec::new, |queues| {
            queues
                .keys()
                .filter(|k| {
                    activation.tenants.contains(&k.tenant)
                        && k.routing.admits(&k.tenant, &activation.taker, &activation.rivals)
                })
                .cloned()
                .collect()
        });
        // Which of them are limited (none, the usual case, costs nothing).
        let mut limited: Vec<bool> = match self.limits.is_empty() {
            true => Vec::new(),
            false => queues.iter().map(|q| self.is_limited(&q.tenant, &activation.job_type)).collect(),
        };
        // Jobs passed over because their key's limit holds them back, and
        // how many of each queue.
        let mut passed: Vec<(QueueKey, JobKey)> = Vec::new();
        let mut passes: Vec<usize> = vec![0; limited.len()];
        while (activated.len() as u32) < activation.max_jobs {
            let Some((queue, key)) = self.best_ready(&activation.job_type, &queues) else { break };
            let size = ActivatedJobData::encoded_len(&self.jobs[&key].spec, &activation.worker) as u64;
            // The first job is taken whatever its size: one job always fits a
            // message, and a job that never fit the budget would never run.
            if !activated.is_empty() && bytes.saturating_add(size) > activation.max_bytes {
                break;
            }
            let is_limited = limited.get(queue).copied().unwrap_or(false);
            if is_limited {
                // Asking refills the buckets, taken from or not: stored either way.
                let name = (queues[queue].tenant.clone(), activation.job_type.clone());
                if !out.limits_changed.contains(&name) {
                    out.limits_changed.push(name);
                }
                match self.admit(key) {
                    Ok(()) => {}
                    Err(super::limits::Blocked::Queue) => {
                        queues.remove(queue);
                        limited.remove(queue);
                        passes.remove(queue);
                        continue;
                    }
                    Err(super::limits::Blocked::Key) => {
                        let popped = self.pop_ready(&activation.job_type, &queues[queue]);
                        debug_assert_eq!(popped, Some(key));
                        passed.push((queues[queue].clone(), key));
                        passes[queue] += 1;
                        if passes[queue] >= super::limits::MAX_PASSED {
                            // Enough looked at: the rest of the queue waits.
                            queues.remove(queue);
                            limited.remove(queue);
                            passes.remove(queue);
                        }
                        continue;
                    }
                }
            }
            bytes = bytes.saturating_add(size);
            let popped = self.pop_ready(&activation.job_type, &queues[queue]);
            debug_assert_eq!(popped, Some(key));
            let job = self.jobs.get_mut(&key).expect("ready jobs are in memory");
            // A job that names its own activation timeout is held that long.
            let timeout_ms = crate::core::activation_timeout(&job.spec).unwrap_or(taker_timeout_ms);
            let deadline = self.clock.saturating_add(timeout_ms);
            job.state = JobState::Activated;
            job.attempt += 1;
            job.activated_at = self.clock;
            out.created_to_activated.push(self.clock - job.created_at);
            let waited_ms = self.clock - job.created_at;
            queues::tally(&mut self.windows, self.clock, &job.spec, Tally::Activated { waited_ms });
            job.worker.clone_from(&activation.worker);
            job.deadline = deadline;
            job.timeout_ms = timeout_ms;
            out.happen(Lifecycle::Activated, job, deadline, activation.worker.clone());
            job.session = activation.session;
            job.history.record(
                self.clock,
                EventKind::Activated {
                    attempt: job.attempt,
                    worker: activation.worker.clone(),
                    session: activation.session,
                    via: activation.via,
                },
            );
            if activation.session != 0 {
                self.held.insert((activation.session, key));
            }
            if is_limited {
                self.note_admitted(key);
            }
            let job = &self.jobs[&key];
            self.deadlines.insert((deadline, key));
            out.touched.push(key);
            out.count(&activation.job_type, Outcome::Activated);
            activated.push(ActivatedJobData {
                key,
                spec: Arc::clone(&job.spec),
                worker: job.worker.clone(),
                retries: job.retries,
                deadline,
                attempt: job.attempt,
                created_at: job.created_at,
                stage: job.stage().unwrap_or_default().to_string(),
            });
        }
        for (queue, key) in passed {
            let priority = self.jobs[&key].spec.priority;
            self.put_back(&activation.job_type, queue, (std::cmp::Reverse(priority), key));
        }
        activated
    }
    /// The best ready job of a type over the queues (highest priority, then
    /// oldest), with the index of its queue in `queues`.
    pub(super) fn best_ready(&self, job_type: &str, queues: &[QueueKey]) -> Option<(usize, JobKey)> {
        let ready = self.ready.get(job_type)?;
        queues
            .iter()
            .enumerate()
            .filter_map(|(i, k)| ready.get(k).and_then(|q| q.first()).map(|first| (*first, i)))
            .min_by_key(|(first, _)| *first)
            .map(|((_, key), i)| (i, key))
    }
    /// Takes the first job off one of a type's ready queues (the one
    /// [`Self::best_ready`] named).
    pub(super) fn pop_ready(&mut self, job_type: &str, queue_key: &QueueKey) -> Option<JobKey> {
        let queues = self.ready.get_mut(job_type)?;
        let queue = queues.get_mut(queue_key)?;
        let (_, key) = queue.pop_first()?;
        if queue.is_empty() {
            queues.remove(queue_key);
            if queues.is_empty() {
                self.ready.remove(job_type);
            }
        }
        Some(key)
    }
}
