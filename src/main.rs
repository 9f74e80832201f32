//! The `drover` command: run a node, use a cluster from the shell, run a
//! command-line worker, benchmark.

mod cli;

use clap::Parser;

/// jemalloc (the default `jemalloc` feature), for Rust's allocations and, through
/// the unprefixed `malloc`, for RocksDB's. It hands freed memory back to the
/// kernel on its own, where glibc keeps what compactions used
/// (docs/operations.md, "Memory").
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read at its start (`MALLOC_CONF` in the environment
/// overrides them): freed pages go back to the kernel after about a second
/// (jemalloc's default is ten), with `MADV_DONTNEED`, so they leave the
/// resident set at once (lazily freed pages stay in it until the kernel needs
/// them). A node's memory is mostly memtables filling and being flushed, and
/// each flush frees tens of MiB at once: returned within a second, the
/// highest resident peak of ten minutes at 1,000 jobs/s was 6–7% lower and
/// the end 8–16% lower, and throughput did not move (docs/benchmarks.md).
/// Eight arenas, what jemalloc makes on the 2-core machine the figures come
/// from: by default it makes four per core of the host, whatever a pod's CPU
/// limit, and each holds memory of its own. Its background thread starts
/// with `drover serve` (`memory::setup_allocator`).
#[cfg(feature = "jemalloc")]
#[allow(non_upper_case_globals)]
#[unsafe(export_name = "malloc_conf")]
pub static malloc_conf: &[u8; 47] = b"dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:8\0";

fn main() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(cli::run(cli))
}
