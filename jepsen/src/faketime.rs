//! Running a node under libfaketime (Debian's `faketime` package), the clock
//! faults' tool. Shared by the fault suite and the integration tests
//! (`tests/common` includes this file).
//!
//! libfaketime starts itself on the first clock read, and its start-up calls
//! `malloc`: for a missing `__ftime` and for versioned `timer_settime` and
//! `timer_gettime` (the error message of a failed `dlsym` is allocated), and
//! in `sem_open`. jemalloc, the node's allocator, reads the monotonic clock
//! while it holds its own start-up lock, on the process's first allocation,
//! which libstdc++'s constructor makes before libfaketime's runs. So
//! `LD_PRELOAD=libfaketimeMT.so.1` alone hangs a node at start: jemalloc
//! waits for libfaketime, which waits for jemalloc. Two things undo it:
//!
//! - libstdc++ is preloaded ahead of libfaketime, which makes the loader run
//!   libfaketime's constructor first: it is fully started before anything
//!   allocates;
//! - a small library preloaded after libfaketime supplies the three symbols
//!   it looks up and this glibc lacks, so its start-up allocates nothing until
//!   it has marked itself started. jemalloc's first clock read then goes
//!   through a started libfaketime. Nothing calls these three: on x86-64 no
//!   program links against them.
//!
//! The monotonic clock must stay real (`FAKETIME_DONT_FAKE_MONOTONIC=1`, which
//! [`env`] sets), as the clock faults want anyway.

use std::path::{Path, PathBuf};
use std::process::Command;

/// libfaketime, from Debian's `faketime` package (scripts/setup.sh installs it).
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

const SHIM_SOURCE: &str = r#"
#include <errno.h>
#include <sys/timeb.h>
int __ftime(struct timeb *tp) { return ftime(tp); }
int drover_timer_settime_22(void *t, int f, const void *n, void *o) { errno = ENOSYS; return -1; }
int drover_timer_gettime_22(void *t, void *c) { errno = ENOSYS; return -1; }
__asm__(".symver drover_timer_settime_22, timer_settime@GLIBC_2.2");
__asm__(".symver drover_timer_gettime_22, timer_gettime@GLIBC_2.2");
"#;

const SHIM_VERSIONS: &str = "GLIBC_2.2 { };\nDROVER_FAKETIME { global: __ftime; local: *; };\n";

/// The environment that runs a process under libfaketime with its wall clock
/// read from `clock_file` (`+0`, `-3600`, `+0 x2`, ...). Builds the small
/// preload library once per machine (into the temporary directory, with
/// `cc`).
pub fn env(clock_file: &Path) -> anyhow::Result<Vec<(&'static str, String)>> {
    if !Path::new(LIBFAKETIME).exists() {
        anyhow::bail!("clock faults need {LIBFAKETIME} (Debian's faketime package; scripts/setup.sh installs it)");
    }
    let shim = shim()?;
    Ok(vec![
        ("LD_PRELOAD", format!("libstdc++.so.6 {LIBFAKETIME} {}", shim.display())),
        ("FAKETIME_TIMESTAMP_FILE", clock_file.display().to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ])
}

/// The preload library's path, built if it is not there yet. Its name holds a
/// hash of its source, so a changed source is built afresh; concurrent
/// builders each write their own file and rename it into place.
fn shim() -> anyhow::Result<PathBuf> {
    let hash = SHIM_SOURCE
        .bytes()
        .chain(SHIM_VERSIONS.bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let dir = std::env::temp_dir();
    let path = dir.join(format!("drover-faketime-{hash:016x}.so"));
    if path.exists() {
        return Ok(path);
    }
    let work = dir.join(format!("drover-faketime-build-{}-{:?}", std::process::id(), std::thread::current().id()));
    std::fs::create_dir_all(&work)?;
    let (source, versions, built) = (work.join("shim.c"), work.join("shim.map"), work.join("shim.so"));
    std::fs::write(&source, SHIM_SOURCE)?;
    std::fs::write(&versions, SHIM_VERSIONS)?;
    let output = Command::new("cc")
        .args(["-shared", "-fPIC", "-w", "-o"])
        .arg(&built)
        .arg(&source)
        .arg(format!("-Wl,--version-script={}", versions.display()))
        .output()
        .map_err(|e| anyhow::anyhow!("running cc to build the libfaketime preload library: {e}"))?;
    if !output.status.success() {
        anyhow::bail!(
            "cc could not build the libfaketime preload library: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::rename(&built, &path)?;
    std::fs::remove_dir_all(&work)?;
    Ok(path)
}
