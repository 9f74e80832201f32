//! Reads a client stream in chunks bounded by count *and* bytes.
//!
//! The streaming calls (`CreateJobs`, `CompleteJobs` and their batch forms)
//! take whatever messages are waiting as one chunk, so a busy client shares
//! Raft entries and syncs. A message weighs the requests it carries (one, or a
//! batch's jobs) and its bytes. A chunk closes when its requests reach
//! `max_items` or its bytes reach `max_bytes`, whichever comes first: a stream
//! of large requests holds a few of them in memory, not a thousand. Messages
//! are never split across chunks.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;

/// The stream of chunks of `inner`; see the module docs. Like
/// `StreamExt::ready_chunks`, a chunk is also handed on when `inner` has
/// nothing more ready, so a slow client never waits for a chunk to fill.
pub struct BudgetChunks<S: Stream> {
    inner: S,
    /// What one item weighs: the requests it carries, and its bytes.
    weigh: fn(&S::Item) -> (usize, usize),
    max_items: usize,
    max_bytes: usize,
    pending: Vec<S::Item>,
    pending_items: usize,
    pending_bytes: usize,
    ended: bool,
}

impl<S: Stream + Unpin> BudgetChunks<S> {
    /// `weigh` tells what one item weighs (requests, bytes); a chunk can
    /// exceed either budget by at most one item.
    pub fn new(inner: S, max_items: usize, max_bytes: usize, weigh: fn(&S::Item) -> (usize, usize)) -> Self {
        BudgetChunks {
            inner,
            weigh,
            max_items: max_items.max(1),
            max_bytes,
            pending: Vec::new(),
            pending_items: 0,
            pending_bytes: 0,
            ended: false,
        }
    }

    fn take(&mut self) -> Vec<S::Item> {
        self.pending_items = 0;
        self.pending_bytes = 0;
        std::mem::take(&mut self.pending)
    }
}

// The items are only moved, never pinned, so pinning a chunker pins nothing
// but the inner stream, which is `Unpin` itself.
impl<S: Stream + Unpin> Unpin for BudgetChunks<S> {}

impl<S: Stream + Unpin> Stream for BudgetChunks<S> {
    type Item = Vec<S::Item>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Ready(Some(item)) => {
                    let (items, bytes) = (this.weigh)(&item);
                    this.pending_items = this.pending_items.saturating_add(items);
                    this.pending_bytes = this.pending_bytes.saturating_add(bytes);
                    this.pending.push(item);
                    if this.pending_items >= this.max_items || this.pending_bytes >= this.max_bytes {
                        return Poll::Ready(Some(this.take()));
                    }
                }
                Poll::Ready(None) => {
                    this.ended = true;
                    let last = this.take();
                    return Poll::Ready((!last.is_empty()).then_some(last));
                }
                Poll::Pending if this.pending.is_empty() => return Poll::Pending,
                Poll::Pending => return Poll::Ready(Some(this.take())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn weights(chunks: &[Vec<usize>]) -> Vec<usize> {
        chunks.iter().map(|c| c.iter().sum()).collect()
    }

    #[tokio::test]
    async fn a_chunk_closes_at_its_count_or_its_bytes() {
        let by_count: Vec<Vec<usize>> =
            BudgetChunks::new(futures::stream::iter(vec![1; 10]), 4, 1000, |w| (1, *w)).collect().await;
        assert_eq!(by_count.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4, 2]);

        let by_bytes: Vec<Vec<usize>> =
            BudgetChunks::new(futures::stream::iter(vec![300; 10]), 100, 1000, |w| (1, *w)).collect().await;
        assert_eq!(weights(&by_bytes), [1200, 1200, 600], "closes at the first item that reaches the budget");

        let huge: Vec<Vec<usize>> =
            BudgetChunks::new(futures::stream::iter(vec![5000, 1, 5000]), 100, 1000, |w| (1, *w)).collect().await;
        assert_eq!(huge, [vec![5000], vec![1, 5000]], "an item over the budget is a chunk of its own");
    }

    #[tokio::test]
    async fn an_item_counts_the_requests_it_carries_and_is_never_split() {
        // Items are batches of `n` requests of 10 bytes each.
        let batches: Vec<Vec<usize>> =
            BudgetChunks::new(futures::stream::iter(vec![3, 3, 1, 8, 2]), 4, 1000, |n| (*n, n * 10)).collect().await;
        assert_eq!(batches, [vec![3, 3], vec![1, 8], vec![2]], "closes once the requests reach the count");

        let empties: Vec<Vec<usize>> =
            BudgetChunks::new(futures::stream::iter(vec![0, 0, 0]), 2, 1000, |n| (*n, 1)).collect().await;
        assert_eq!(empties, [vec![0, 0, 0]], "an empty batch weighs no requests");
    }

    #[tokio::test]
    async fn a_chunk_is_handed_on_when_nothing_more_is_ready() {
        let (tx, rx) = futures::channel::mpsc::unbounded::<usize>();
        let mut chunks = BudgetChunks::new(rx, 100, 1000, |w| (1, *w));
        tx.unbounded_send(1).unwrap();
        tx.unbounded_send(2).unwrap();
        assert_eq!(chunks.next().await, Some(vec![1, 2]));
        tx.unbounded_send(3).unwrap();
        drop(tx);
        assert_eq!(chunks.next().await, Some(vec![3]));
        assert_eq!(chunks.next().await, None);
        assert_eq!(chunks.next().await, None, "stays ended");
    }
}
