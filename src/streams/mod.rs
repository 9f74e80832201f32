//! Job streams, both ends of their flow control in one place.
//!
//! A worker opens a stream at a gateway; equivalent streams are aggregated
//! and registered with every broker; a partition leader pushes activated jobs
//! to a registered stream, and the gateway hands each to a ready client. This
//! module owns the whole protocol:
//! - [`broker`]: the broker's registry of streams gateways registered, and
//!   what a leader knows of each stream's room;
//! - [`registry`]: the gateway's registry of its aggregated streams;
//! - [`aggregator`]: the actor per aggregated stream that hands pushed jobs
//!   to its clients and offers freed room to waiting partitions;
//! - [`flow`]: credits, held jobs, room signals and the gateway's link to
//!   partition leaders;
//! - [`client`]: a worker's end of a stream;
//! - [`spec`]: what a worker asks for, and the form jobs leave in.
//!
//! It sits below the partition leader and the gateway, which both use it;
//! it reaches partition leaders and other gateways only through the links
//! the cluster service plugs in ([`LeaderLink`] here,
//! [`crate::partition::GatewayLink`] there).
//!
//! The gateway's side of job streaming: worker streams aggregated by
//! equivalence, and the hand-off of pushed jobs to a ready client.
//!
//! Two worker streams are equivalent when they ask for the same job type,
//! worker name, activation timeout, set of fetch variables and set of tenants
//! (order and repeats do not matter). Equivalent streams share one aggregated
//! stream id, registered once with every broker, and one
//! [`aggregator::StreamAggregator`] actor that owns
//! their clients and hands out pushed jobs.
//!
//! A client is ready while it holds fewer jobs than its `max_jobs_in_flight`:
//! a job pushed to it is held until the worker completes or fails it (through
//! this gateway, or through another one whose partition leader then tells this
//! gateway), or its activation timeout has passed on this gateway's own clock
//! ([`Held`]). HTTP/2 flow control alone cannot say a worker is busy: a
//! client's receive window holds thousands of small jobs, which would sit there
//! past their timeout.
//!
//! Stream ids carry a per-start epoch in their high 32 bits, so a restarted
//! gateway never answers to a registration its previous run left at a broker.
//!
//! Every push's answer also says how many more jobs the stream's clients can
//! take, so partition leaders push no more than that. A partition whose push
//! found the stream full is offered the room once a client frees a slot
//! ([`LeaderLink::offer_room`]; see the aggregator for the order of offers):
//! the leader keeps its jobs activatable meanwhile, rather than activating
//! them for a stream that would answer "not ready".
//!
//! A pushed job is reported as rejected only when no client certainly got it:
//! the aggregator hands out nothing from a push older than
//! [`PUSH_DELIVER_WITHIN`], and the gateway waits for its answer up to
//! [`PUSH_ANSWER_WITHIN`]. A push still unanswered then is reported as of
//! unknown outcome, so its jobs are not yielded to a second worker while the
//! first may still receive them. When the aggregator comes to that push, it
//! knows which jobs no client took, and the gateway yields those itself
//! ([`LeaderLink::hand_back`]) instead of leaving them to their activation
//! timeout.

pub mod aggregator;
pub mod broker;
pub mod client;
pub mod flow;
pub mod registry;
pub mod spec;

pub use broker::{BrokerStreams, PushOutcome, PushedActivations, RemoteStream, Reservation, StreamRooms, STREAM_TTL};
pub use client::{ClientBatches, ClientStream, OnClose, BATCH_MESSAGE_BYTES, BATCH_MESSAGE_JOBS};
pub use flow::{Credits, Held, LeaderLink, OfferAnswer, RoomSignal, StreamKey};
pub use registry::{ClientStreamView, GatewayStreams, Opened, PUSH_ANSWER_WITHIN, PUSH_DELIVER_WITHIN};
pub use spec::{activated_job, filter_variables, WorkerSpec, DEFAULT_MAX_IN_FLIGHT, MAX_IN_FLIGHT_LIMIT};
