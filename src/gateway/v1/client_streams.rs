//! Client streams read in chunks: `CreateJobs`, `CompleteJobs` and their
//! batch forms. The requests waiting on a stream are read together (within a
//! count and a byte budget), handled as one batch per partition, and
//! answered in order; a batch message is answered in its own shape.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tonic::Status;

use super::chunks::BudgetChunks;
use crate::gateway::api::ApiError;
use crate::proto::gateway::{CompleteJobBatch, CompleteJobRequest, CreateJobBatch, CreateJobRequest};

pub type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Requests of a client stream read together into one batch per partition.
pub const STREAM_CHUNK: usize = 1024;
/// A chunk also closes when its requests reach this many bytes, so a stream
/// holds at most `STREAM_CHUNKS_IN_FLIGHT` × (this + one request) in memory.
const STREAM_CHUNK_BYTES: usize = 1 << 20;
/// Chunks of a client stream in flight at once.
const STREAM_CHUNKS_IN_FLIGHT: usize = 4;

/// A message of a client stream that the gateway reads in chunks: one
/// request, or a batch of them.
pub trait Carries: prost::Message + Send + 'static {
    /// The requests the message carries.
    fn requests(&self) -> usize {
        1
    }
}

impl Carries for CreateJobRequest {}
impl Carries for CompleteJobRequest {}

impl Carries for CreateJobBatch {
    fn requests(&self) -> usize {
        self.jobs.len()
    }
}

impl Carries for CompleteJobBatch {
    fn requests(&self) -> usize {
        self.jobs.len()
    }
}

/// Answers a client stream in chunks: the messages waiting are read together
/// (whole messages carrying about [`STREAM_CHUNK`] requests, or about
/// [`STREAM_CHUNK_BYTES`]), handled as one batch per partition by `handle`,
/// which answers each message, and answered in order. A broken inbound
/// stream ends the answers with its status. `method` names the call in
/// [`crate::metrics::STREAM_MESSAGES`].
pub fn chunked<In, Msg, Resp, F, Fut>(method: &'static str, inbound: In, handle: F) -> BoxStream<Resp>
where
    In: Stream<Item = Result<Msg, Status>> + Unpin + Send + 'static,
    Msg: Carries,
    Resp: Send + 'static,
    F: Fn(Vec<Msg>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Vec<Resp>> + Send + 'static,
{
    let weigh = |item: &Result<Msg, Status>| item.as_ref().map_or((1, 0), |m| (m.requests(), m.encoded_len()));
    let responses = BudgetChunks::new(inbound, STREAM_CHUNK, STREAM_CHUNK_BYTES, weigh)
        .map(move |chunk| {
            let mut failed_read = None;
            let requests: Vec<Msg> = chunk
                .into_iter()
                .filter_map(|item| match item {
                    Ok(request) => Some(request),
                    Err(status) => {
                        failed_read = Some(status);
                        None
                    }
                })
                .collect();
            let received = requests.len() as u64;
            let answers = handle(requests);
            async move {
                let mut out: Vec<Result<Resp, Status>> = answers.await.into_iter().map(Ok).collect();
                metrics::counter!(crate::metrics::STREAM_MESSAGES, "method" => method)
                    .increment(received + out.len() as u64);
                out.extend(failed_read.map(Err));
                futures::stream::iter(out)
            }
        })
        .buffered(STREAM_CHUNKS_IN_FLIGHT)
        .flatten();
    Box::pin(responses)
}

/// The jobs of a chunk of batches, for handling as one chunk of requests,
/// and how to answer each batch: `Ok(n)` with the next `n` answers, or
/// `Err(n)` when it carried `n` jobs, more than a batch may (it is refused
/// whole).
pub fn unbatch<Req>(batches: Vec<Vec<Req>>) -> (Vec<Req>, Vec<Result<usize, usize>>) {
    let mut requests = Vec::with_capacity(batches.iter().map(Vec::len).sum());
    let shapes = batches
        .into_iter()
        .map(|batch| match batch.len() {
            n if n > STREAM_CHUNK => Err(n),
            n => {
                requests.extend(batch);
                Ok(n)
            }
        })
        .collect();
    (requests, shapes)
}

/// The answers of [`unbatch`]'s requests, grouped back into one answer per
/// batch; a refused batch gets `refused(n)` for each of its jobs.
pub fn rebatch<Resp>(
    answers: Vec<Resp>,
    shapes: Vec<Result<usize, usize>>,
    refused: impl Fn(usize) -> Resp,
) -> Vec<Vec<Resp>> {
    let mut answers = answers.into_iter();
    shapes
        .into_iter()
        .map(|shape| match shape {
            Ok(n) => answers.by_ref().take(n).collect(),
            Err(n) => (0..n).map(|_| refused(n)).collect(),
        })
        .collect()
}

/// What each job of a batch over [`STREAM_CHUNK`] jobs is answered.
pub fn batch_too_large(jobs: usize) -> ApiError {
    ApiError::InvalidArgument(format!(
        "a batch carries at most {STREAM_CHUNK} jobs, this one carried {jobs}: nothing of it was done; send it as smaller batches"
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use prost::Message;

    use super::*;

    #[tokio::test]
    async fn a_stream_of_large_requests_is_held_in_chunks_within_the_byte_budget() {
        let big = CreateJobRequest {
            r#type: "t".into(),
            variables: format!(r#"{{"blob":"{}"}}"#, "x".repeat(256 << 10)),
            ..Default::default()
        };
        let one = big.encoded_len();
        let requests = futures::stream::iter((0..40).map(move |_| Ok(big.clone())));
        let chunk_bytes = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&chunk_bytes);
        let answers: Vec<_> = chunked("CreateJobs", requests, move |chunk: Vec<CreateJobRequest>| {
            seen.lock().unwrap().push(chunk.iter().map(Message::encoded_len).sum::<usize>());
            async move { chunk.into_iter().map(|r| r.r#type).collect::<Vec<_>>() }
        })
        .collect()
        .await;

        assert_eq!(answers.len(), 40, "one answer per request");
        assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|t| t == "t")));
        let chunk_bytes = chunk_bytes.lock().unwrap();
        assert!(chunk_bytes.len() > 1, "40 requests of {one} bytes in one chunk");
        for bytes in chunk_bytes.iter() {
            assert!(*bytes < STREAM_CHUNK_BYTES + one, "a chunk of {bytes} bytes; the budget is {STREAM_CHUNK_BYTES}");
        }
    }

    #[test]
    fn batches_are_answered_in_their_shape_and_one_over_the_limit_is_refused_whole() {
        let batches = vec![vec![1, 2], vec![], vec![0; STREAM_CHUNK + 1], vec![3]];
        let (requests, shapes) = unbatch(batches);
        assert_eq!(requests, [1, 2, 3], "the refused batch's jobs are not handled");
        let answers: Vec<i64> = requests.iter().map(|r| r * 10).collect();
        let answered = rebatch(answers, shapes, |n| -(n as i64));
        assert_eq!(answered.len(), 4, "one answer per batch");
        assert_eq!(answered[0], [10, 20]);
        assert!(answered[1].is_empty());
        assert_eq!(answered[2], vec![-((STREAM_CHUNK + 1) as i64); STREAM_CHUNK + 1], "every job refused");
        assert_eq!(answered[3], [30]);
    }
}
