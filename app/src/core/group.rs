//! Group commit: whatever is queued while one batch is being written goes together in the next.
//! Alone, an item is its own batch and waits for nothing; under load, many small transactions
//! (each a round trip and a WAL flush) become a few larger ones. Used for new memories
//! ([`super::memories`]), the worker's claims of their tasks and its stores of embedded memories
//! ([`super::ingest`]).
use std::future::Future;

use tokio::sync::{mpsc, oneshot};

/// A queue in front of one writer task.
pub struct GroupCommit<T, R> {
    queue: mpsc::UnboundedSender<(T, oneshot::Sender<R>)>,
}

impl<T: Send + 'static, R: Send + 'static> GroupCommit<T, R> {
    /// Starts the writer task (inside a Tokio runtime). `write` gets each batch, at most `max`
    /// items in the order they were submitted, and answers one result per item, in that order.
    /// Batches are written one at a time.
    pub fn spawn<F, Fut>(max: usize, write: F) -> Self
    where
        F: Fn(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<R>> + Send,
    {
        let (this, writer) = Self::new(max, write);
        tokio::spawn(writer);
        this
    }

    /// As [`Self::spawn`], but the writer is returned for the caller to run (on a runtime of
    /// its own, say); it ends once every handle is dropped.
    pub fn new<F, Fut>(max: usize, write: F) -> (Self, impl Future<Output = ()> + Send + 'static)
    where
        F: Fn(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<R>> + Send,
    {
        let (queue, mut rx) = mpsc::unbounded_channel::<(T, oneshot::Sender<R>)>();
        let writer = async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < max {
                    match rx.try_recv() {
                        Ok(item) => batch.push(item),
                        Err(_) => break,
                    }
                }
                let (items, replies): (Vec<T>, Vec<_>) = batch.into_iter().unzip();
                let n = items.len();
                let results = write(items).await;
                debug_assert_eq!(results.len(), n, "one result per item");
                // A missing result drops its reply: the caller sees the writer as stopped.
                for (reply, result) in replies.into_iter().zip(results) {
                    let _ = reply.send(result);
                }
            }
        };
        (Self { queue }, writer)
    }

    /// Queues `item` and waits for its batch to be written: its result, or `None` if the writer
    /// has stopped.
    pub async fn submit(&self, item: T) -> Option<R> {
        let (reply, answer) = oneshot::channel();
        self.queue.send((item, reply)).ok()?;
        answer.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Items submitted while a batch is being written are written together next, each caller
    /// gets its own result, and a batch never exceeds `max`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn items_queued_during_a_write_go_together_in_the_next() {
        let batches = Arc::new(Mutex::new(Vec::<Vec<u32>>::new()));
        let writer = {
            let batches = batches.clone();
            Arc::new(GroupCommit::spawn(4, move |items: Vec<u32>| {
                let batches = batches.clone();
                async move {
                    batches.lock().unwrap().push(items.clone());
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    items.iter().map(|i| i * 10).collect::<Vec<_>>()
                }
            }))
        };
        let first = {
            let writer = writer.clone();
            tokio::spawn(async move { writer.submit(0).await })
        };
        // The first batch is being written; six more arrive meanwhile.
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let rest: Vec<_> = (1..7)
            .map(|i| {
                let writer = writer.clone();
                tokio::spawn(async move { writer.submit(i).await })
            })
            .collect();
        assert_eq!(first.await.unwrap(), Some(0));
        for (i, handle) in rest.into_iter().enumerate() {
            assert_eq!(handle.await.unwrap(), Some((i as u32 + 1) * 10));
        }
        let batches = batches.lock().unwrap().clone();
        assert_eq!(batches.len(), 3, "{batches:?}");
        assert_eq!(batches[0], vec![0]);
        assert_eq!(batches[1].len(), 4, "{batches:?}");
        assert_eq!(batches.concat().len(), 7);
    }
}
