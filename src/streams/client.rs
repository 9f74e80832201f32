//! A worker's end of an aggregated stream: the jobs pushed to it, one to a
//! message or in batches, with their job tokens, and what it hands back when
//! the worker goes away.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::Status;

use super::flow::RoomSignal;
use super::registry::Opened;
use crate::core::JobKey;
use crate::proto::gateway as pb;

/// Jobs in one message of `StreamActivatedJobBatches`, at most.
pub const BATCH_MESSAGE_JOBS: usize = 1024;
/// Bytes of jobs in one such message, about: the job that reaches it is the last.
pub const BATCH_MESSAGE_BYTES: usize = 1 << 20;

/// Mints the job token of a job (key, attempt, deadline in its partition's
/// time) as it leaves for its worker.
pub type MintJobToken = Arc<dyn Fn(u64, u32, crate::core::Millis) -> String + Send + Sync>;

/// A worker's end of an aggregated stream. Dropping it (the worker went away)
/// leaves the aggregate and hands back every job still buffered for it, so
/// those jobs do not wait for their activation timeout.
pub struct ClientStream {
    receiver: mpsc::Receiver<Result<pb::ActivatedJob, Status>>,
    /// Told when jobs leave the buffer: a buffer that was full has room
    /// (its jobs' slots may have been freed while they waited in it).
    signal: Arc<RoomSignal>,
    on_close: Option<OnClose>,
    /// Set after handing out a message: the next poll says Pending once, so
    /// the encoder sends each message in its own chunk instead of draining
    /// the buffer into a write it cannot take back. Jobs left in the buffer
    /// can then be handed back when the client goes away.
    just_yielded: bool,
    /// An error that ended a batch, for the next poll.
    failed: Option<Status>,
    /// Mints each job's job token as it leaves, when job tokens are on.
    job_tokens: Option<MintJobToken>,
    /// The call, for [`crate::metrics::STREAM_MESSAGES`].
    method: &'static str,
}

impl ClientStream {
    pub fn new(opened: Opened, on_close: OnClose) -> Self {
        ClientStream {
            receiver: opened.receiver,
            signal: opened.signal,
            on_close: Some(on_close),
            just_yielded: false,
            failed: None,
            job_tokens: None,
            method: "StreamActivatedJobs",
        }
    }

    /// Jobs leave with a job token from `mint`.
    pub fn with_job_tokens(mut self, mint: MintJobToken) -> Self {
        self.job_tokens = Some(mint);
        self
    }

    /// The next message's jobs: those ready now, at least one, at most
    /// `max_jobs`, until their encoded bytes reach `max_bytes`.
    fn poll_jobs(
        &mut self,
        cx: &mut Context<'_>,
        max_jobs: usize,
        max_bytes: usize,
    ) -> Poll<Option<Result<Vec<pb::ActivatedJob>, Status>>> {
        if self.just_yielded {
            self.just_yielded = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if let Some(status) = self.failed.take() {
            return Poll::Ready(Some(Err(status)));
        }
        let mut jobs = Vec::new();
        let mut bytes = 0;
        while jobs.len() < max_jobs && bytes < max_bytes {
            match self.receiver.poll_recv(cx) {
                Poll::Ready(Some(Ok(mut job))) => {
                    if let Some(mint) = &self.job_tokens {
                        job.job_token = mint(job.key, job.attempt, job.deadline);
                    }
                    if max_bytes < usize::MAX {
                        bytes += prost::Message::encoded_len(&job);
                    }
                    jobs.push(job);
                }
                Poll::Ready(Some(Err(status))) if jobs.is_empty() => return Poll::Ready(Some(Err(status))),
                Poll::Ready(Some(Err(status))) => {
                    self.failed = Some(status);
                    break;
                }
                Poll::Ready(None) if jobs.is_empty() => return Poll::Ready(None),
                Poll::Pending if jobs.is_empty() => return Poll::Pending,
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
        self.just_yielded = true;
        self.signal.freed();
        metrics::counter!(crate::metrics::STREAM_MESSAGES, "method" => self.method).increment(1);
        Poll::Ready(Some(Ok(jobs)))
    }
}

/// Runs when a client stream ends, with the (key, attempt) of every job still
/// buffered for it.
pub type OnClose = Box<dyn FnOnce(Vec<(JobKey, u32)>) + Send>;

impl Stream for ClientStream {
    type Item = Result<pb::ActivatedJob, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_jobs(cx, 1, usize::MAX)
            .map(|next| next.map(|jobs| jobs.map(|mut jobs| jobs.pop().expect("a message holds a job"))))
    }
}

/// A worker's end of an aggregated stream, several jobs to a message
/// (`StreamActivatedJobBatches`): each message takes what is ready, up to
/// [`BATCH_MESSAGE_JOBS`] and about [`BATCH_MESSAGE_BYTES`].
pub struct ClientBatches(ClientStream);

impl ClientBatches {
    pub fn new(mut stream: ClientStream) -> Self {
        stream.method = "StreamActivatedJobBatches";
        ClientBatches(stream)
    }
}

impl Stream for ClientBatches {
    type Item = Result<pb::ActivatedJobBatch, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = self.0.poll_jobs(cx, BATCH_MESSAGE_JOBS, BATCH_MESSAGE_BYTES);
        next.map(|next| next.map(|jobs| jobs.map(|jobs| pb::ActivatedJobBatch { jobs })))
    }
}

impl Drop for ClientStream {
    fn drop(&mut self) {
        self.receiver.close();
        let mut buffered = Vec::new();
        while let Ok(item) = self.receiver.try_recv() {
            if let Ok(job) = item {
                buffered.push((JobKey(job.key), job.attempt));
            }
        }
        if let Some(on_close) = self.on_close.take() {
            on_close(buffered);
        }
    }
}
