//! The node's long-lived background loops, each with a name, a status and its
//! last error, so an operator can see what runs (`/actuator/tasks`, the
//! console's cluster page) instead of guessing from logs.
//!
//! A loop is a [`BackgroundLoop`]: it has a name and runs until it is done or
//! stopped, reporting through the [`LoopStatus`] it is handed. [`Tasks`]
//! spawns it and keeps its entry: running, finished, stopped (its task was
//! aborted, as at shutdown) or panicked (with the panic's message as its last
//! error). One-off tasks (a single hand-back, a reply) are not registered:
//! only loops that live as long as their node, a partition's leadership or a
//! connection.
//!
//! Ground floor: it imports nothing of Drover's.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use serde::Serialize;
use tokio::task::JoinHandle;

/// A loop the node runs in the background.
pub trait BackgroundLoop: Send + 'static {
    /// Its name, unique among the node's loops while it runs (`leadership
    /// p3`, `gauges`). A loop started under the name of one that ended
    /// replaces its entry.
    fn name(&self) -> String;

    /// Runs until the loop is done or its node stops, telling `status` what
    /// it is doing and what went wrong.
    fn run(self, status: LoopStatus) -> impl Future<Output = ()> + Send;
}

/// A loop made of a name and a function of its status: for loops that are
/// one function already.
pub struct Named<F> {
    name: String,
    body: F,
}

/// `body` as a [`BackgroundLoop`] called `name`.
pub fn named<F, Fut>(name: impl Into<String>, body: F) -> Named<F>
where
    F: FnOnce(LoopStatus) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Named { name: name.into(), body }
}

impl<F, Fut> BackgroundLoop for Named<F>
where
    F: FnOnce(LoopStatus) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    fn name(&self) -> String {
        self.name.clone()
    }

    fn run(self, status: LoopStatus) -> impl Future<Output = ()> + Send {
        (self.body)(status)
    }
}

/// Where a loop is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LoopState {
    Running,
    /// It returned.
    Finished,
    /// Its task was aborted (its node stopping, a leadership lost).
    Stopped,
    /// It panicked; the panic's message is its last error.
    Panicked,
}

/// What `/actuator/tasks` shows of one loop.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoopView {
    pub name: String,
    pub state: LoopState,
    /// What it last said it was doing (empty: nothing said yet).
    pub status: String,
    pub last_error: Option<String>,
    /// Milliseconds since the Unix epoch, by this node's clock.
    pub last_error_at: Option<u64>,
    pub started_at: u64,
    pub updated_at: u64,
    /// Errors it reported since it started.
    pub errors: u64,
}

/// A loop's handle on its own entry.
#[derive(Clone)]
pub struct LoopStatus(Arc<Mutex<LoopView>>);

impl LoopStatus {
    /// What the loop is doing now, in a few words.
    pub fn set(&self, status: impl Into<String>) {
        let mut view = self.view();
        view.status = status.into();
        view.updated_at = now_ms();
    }

    /// Something went wrong; the loop goes on (or returns after this).
    pub fn error(&self, error: impl std::fmt::Display) {
        let mut view = self.view();
        let now = now_ms();
        view.last_error = Some(error.to_string());
        view.last_error_at = Some(now);
        view.errors += 1;
        view.updated_at = now;
    }

    fn end(&self, state: LoopState) {
        let mut view = self.view();
        if view.state == LoopState::Running {
            view.state = state;
            view.updated_at = now_ms();
        }
    }

    fn view(&self) -> std::sync::MutexGuard<'_, LoopView> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Marks a loop stopped if its future is dropped before it ends.
struct Ending(LoopStatus);

impl Drop for Ending {
    fn drop(&mut self) {
        self.0.end(LoopState::Stopped);
    }
}

/// Every loop a node started, by name.
#[derive(Default)]
pub struct Tasks {
    loops: Mutex<BTreeMap<String, LoopStatus>>,
}

impl Tasks {
    pub fn new() -> Arc<Tasks> {
        Arc::new(Tasks::default())
    }

    /// Starts `task` on the runtime and lists it.
    pub fn spawn<L: BackgroundLoop>(&self, task: L) -> JoinHandle<()> {
        let name = task.name();
        let now = now_ms();
        let status = LoopStatus(Arc::new(Mutex::new(LoopView {
            name: name.clone(),
            state: LoopState::Running,
            status: String::new(),
            last_error: None,
            last_error_at: None,
            started_at: now,
            updated_at: now,
            errors: 0,
        })));
        self.loops.lock().unwrap_or_else(|e| e.into_inner()).insert(name, status.clone());
        let body = task.run(status.clone());
        // Dropped with the task's future, polled or not.
        let ending = Ending(status.clone());
        tokio::spawn(async move {
            match AssertUnwindSafe(body).catch_unwind().await {
                Ok(()) => status.end(LoopState::Finished),
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic without a message".into());
                    status.error(format!("panicked: {message}"));
                    status.end(LoopState::Panicked);
                }
            }
            drop(ending);
        })
    }

    /// Every loop, by name.
    pub fn list(&self) -> Vec<LoopView> {
        self.loops.lock().unwrap_or_else(|e| e.into_inner()).values().map(|s| s.view().clone()).collect()
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_loop_is_listed_with_its_status_and_last_error_and_how_it_ended() {
        let tasks = Tasks::new();
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let running = tasks.spawn(named("waits", |status: LoopStatus| async move {
            status.set("waiting for the signal");
            status.error("a hiccup");
            let _ = wait.await;
        }));
        let panicking = tasks.spawn(named("panics", |_status: LoopStatus| async move {
            panic!("on purpose");
        }));
        let aborted = tasks.spawn(named("aborted", |_status: LoopStatus| std::future::pending::<()>()));
        let _ = panicking.await;
        aborted.abort();
        let _ = aborted.await;
        let by_name = |name: &str| tasks.list().into_iter().find(|l| l.name == name).expect("listed");
        let waits = by_name("waits");
        assert_eq!(waits.state, LoopState::Running);
        assert_eq!(waits.status, "waiting for the signal");
        assert_eq!(waits.last_error.as_deref(), Some("a hiccup"));
        assert_eq!(waits.errors, 1);
        assert_eq!(by_name("panics").state, LoopState::Panicked);
        assert_eq!(by_name("panics").last_error.as_deref(), Some("panicked: on purpose"));
        assert_eq!(by_name("aborted").state, LoopState::Stopped);
        go.send(()).unwrap();
        running.await.unwrap();
        assert_eq!(by_name("waits").state, LoopState::Finished);
    }
}
