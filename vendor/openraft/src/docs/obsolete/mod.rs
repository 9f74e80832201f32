//! Obsolete Designs
//!
//! Several designs in Openraft have been discarded due to the problems they caused for
//! applications. These designs were attempts at optimization or simplification, but ultimately
//! proved to be inappropriate. They are included in this chapter as an archive to explain why they
//! were discarded.

pub mod heartbeat {
    #![doc = include_str!("blank-log-heartbeat.md")]
}

pub mod fast_commit {
    #![doc = include_str!("fast_commit.md")]
}
