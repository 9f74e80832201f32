//! Callbacks used by Storage API

use std::io;

use tokio::sync::mpsc;
use tokio::sync::oneshot;

use crate::async_runtime::AsyncOneshotSendExt;
use crate::core::notify::Notify;
use crate::raft_state::io_state::log_io_id::LogIOId;
use crate::type_config::alias::OneshotSenderOf;
use crate::LogId;
use crate::RaftTypeConfig;
use crate::StorageIOError;
use crate::Vote;

/// A oneshot callback for completion of log io operation.
pub struct LogFlushed<C>
where C: RaftTypeConfig
{
    log_io_id: LogIOId<C::NodeId>,
    reply: Reply<C>,
}

/// Where the completion goes.
enum Reply<C>
where C: RaftTypeConfig
{
    /// To `RaftCore`, which waits for it before its next command.
    Oneshot(OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>),
    /// To `RaftCore`'s notification channel, for a leader's own append: the
    /// leader replicates the entries while they are being flushed and counts
    /// itself in the quorum once this arrives (Drover's change to 0.9.25).
    Notify {
        vote: Vote<C::NodeId>,
        tx: mpsc::UnboundedSender<Notify<C>>,
    },
}

impl<C> LogFlushed<C>
where C: RaftTypeConfig
{
    pub(crate) fn new(
        log_io_id: LogIOId<C::NodeId>,
        tx: OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>,
    ) -> Self {
        Self {
            log_io_id,
            reply: Reply::Oneshot(tx),
        }
    }

    /// A leader's own append, reported to `RaftCore` as
    /// [`Notify::LocalLogFlushed`] instead of awaited.
    pub(crate) fn notify(log_io_id: LogIOId<C::NodeId>, vote: Vote<C::NodeId>, tx: mpsc::UnboundedSender<Notify<C>>) -> Self {
        Self {
            log_io_id,
            reply: Reply::Notify { vote, tx },
        }
    }

    /// Report log io completion event.
    ///
    /// It will be called when the log is successfully appended to the storage or an error occurs.
    pub fn log_io_completed(self, result: Result<(), io::Error>) {
        if let Err(e) = &result {
            tracing::error!("LogFlush error: {}, while flushing upto {}", e, self.log_io_id);
        }
        match self.reply {
            Reply::Oneshot(tx) => {
                if let Err(e) = tx.send(result.map(|_| self.log_io_id)) {
                    tracing::error!("failed to send log io completion event: {:?}", e);
                }
            }
            Reply::Notify { vote, tx } => {
                let notify = Notify::LocalLogFlushed {
                    vote,
                    log_id: self.log_io_id.log_id,
                    result,
                };
                // RaftCore has stopped if this fails: nothing is waiting.
                let _ = tx.send(notify);
            }
        }
    }
}

/// A oneshot callback for completion of applying logs to state machine.
pub struct LogApplied<C>
where C: RaftTypeConfig
{
    last_log_id: LogId<C::NodeId>,
    tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
}

impl<C> LogApplied<C>
where C: RaftTypeConfig
{
    #[allow(dead_code)]
    pub(crate) fn new(
        last_log_id: LogId<C::NodeId>,
        tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
    ) -> Self {
        Self { last_log_id, tx }
    }

    /// Report apply io completion event.
    ///
    /// It will be called when the log is successfully applied to the state machine or an error
    /// occurs.
    pub fn completed(self, result: Result<Vec<C::R>, StorageIOError<C::NodeId>>) {
        let res = match result {
            Ok(x) => {
                tracing::debug!("LogApplied upto {}", self.last_log_id);
                let resp = (self.last_log_id.clone(), x);
                self.tx.send(Ok(resp))
            }
            Err(e) => {
                tracing::error!("LogApplied error: {}, while applying upto {}", e, self.last_log_id);
                self.tx.send(Err(e))
            }
        };

        if let Err(_e) = res {
            tracing::error!("failed to send apply complete event, last_log_id: {}", self.last_log_id);
        }
    }
}
