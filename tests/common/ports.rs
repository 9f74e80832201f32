//! Loopback ports for the nodes and servers a test starts, that no other
//! test running beside it (nextest runs each in its own process) and no
//! outgoing connection is handed meanwhile.
//!
//! A port the kernel picks (`bind :0`) comes from its ephemeral range, from
//! which every outgoing connection takes its own port too: between a test
//! learning the port and its node binding it, a connection of any test may
//! take it, and the node exits at start ("address in use"). So ports come
//! from below that range (20000-32767), each claimed across processes by a
//! file created exclusively in the temporary directory, named after the
//! port and the ten-minute window it was claimed in: a port claimed in this
//! window or the last one is not handed out again.

use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

const FIRST: u16 = 20_000;
/// Below Linux's default ephemeral range (32768-60999).
const END: u16 = 32_768;
const WINDOW_SECS: u64 = 600;

fn claims() -> PathBuf {
    let dir = std::env::temp_dir().join("drover-test-ports");
    std::fs::create_dir_all(&dir).expect("a directory for port claims");
    dir
}

fn random() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// A loopback port free now and claimed for this test.
pub fn free_port() -> u16 {
    let dir = claims();
    let window = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() / WINDOW_SECS;
    let span = u64::from(END - FIRST);
    for _ in 0..1_000 {
        let port = FIRST + (random() % span) as u16;
        if dir.join(format!("{port}.{}", window.saturating_sub(1))).exists() {
            continue;
        }
        let claim = std::fs::OpenOptions::new().write(true).create_new(true).open(dir.join(format!("{port}.{window}")));
        if claim.is_err() {
            continue;
        }
        // Free now (no server of something else there)?
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            forget_old(&dir, window);
            return port;
        }
    }
    // Every try taken: the kernel's choice, as before.
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Removes now and then the claims of windows before the last one.
fn forget_old(dir: &std::path::Path, window: u64) {
    if random() % 64 != 0 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.map_while(Result::ok) {
        let name = entry.file_name();
        let claimed = name.to_str().and_then(|n| n.split_once('.')).and_then(|(_, w)| w.parse::<u64>().ok());
        if claimed.is_some_and(|w| w + 1 < window) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
