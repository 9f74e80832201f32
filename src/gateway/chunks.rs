//! Reads a client stream in chunks bounded by count *and* bytes.
//!
//! The streaming calls (`CreateJobs`, `CompleteJobs`) take whatever requests
//! are waiting as one chunk, so a busy client shares Raft entries and syncs.
//! A chunk closes when it holds `max_items` requests or when its requests'
//! bytes reach `max_bytes`, whichever comes first: a stream of large requests
//! holds a few of them in memory, not a thousand.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;

/// The stream of chunks of `inner`; see the module docs. Like
/// `StreamExt::ready_chunks`, a chunk is also handed on when `inner` has
/// nothing more ready, so a slow client never waits for a chunk to fill.
pub struct BudgetChunks<S: Stream> {
    inner: S,
    size: fn(&S::Item) -> usize,
    max_items: usize,
    max_bytes: usize,
    pending: Vec<S::Item>,
    pending_bytes: usize,
    ended: bool,
}

impl<S: Stream + Unpin> BudgetChunks<S> {
    /// `size` tells what one item weighs; a chunk's bytes can exceed
    /// `max_bytes` by at most one item.
    pub fn new(inner: S, max_items: usize, max_bytes: usize, size: fn(&S::Item) -> usize) -> Self {
        BudgetChunks {
            inner,
            size,
            max_items: max_items.max(1),
            max_bytes,
            pending: Vec::new(),
            pending_bytes: 0,
            ended: false,
        }
    }

    fn take(&mut self) -> Vec<S::Item> {
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
                    this.pending_bytes = this.pending_bytes.saturating_add((this.size)(&item));
                    this.pending.push(item);
                    if this.pending.len() >= this.max_items || this.pending_bytes >= this.max_bytes {
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
            BudgetChunks::new(futures::stream::iter(vec![1; 10]), 4, 1000, |w| *w).collect().await;
        assert_eq!(by_count.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4, 2]);

        let by_bytes: Vec<Vec<usize>> =
            BudgetChunks::new(futures::stream::iter(vec![300; 10]), 100, 1000, |w| *w).collect().await;
        assert_eq!(weights(&by_bytes), [1200, 1200, 600], "closes at the first item that reaches the budget");

        let huge: Vec<Vec<usize>> =
            BudgetChunks::new(futures::stream::iter(vec![5000, 1, 5000]), 100, 1000, |w| *w).collect().await;
        assert_eq!(huge, [vec![5000], vec![1, 5000]], "an item over the budget is a chunk of its own");
    }

    #[tokio::test]
    async fn a_chunk_is_handed_on_when_nothing_more_is_ready() {
        let (tx, rx) = futures::channel::mpsc::unbounded::<usize>();
        let mut chunks = BudgetChunks::new(rx, 100, 1000, |w| *w);
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
