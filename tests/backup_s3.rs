//! Backups to an S3-compatible bucket, through `drover backup` as an operator
//! runs it: taken, listed, verified, restored, refused when an object is
//! damaged, and deleted (a restored node's start is `tests/backup.rs`'). The bucket is served by moto's S3 server (from
//! PyPI, pinned in tests/s3/requirements.txt; `scripts/setup.sh` installs it),
//! started by the test on a loopback port.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::NodeProcess;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const BUCKET: &str = "drover-backups";
/// What the test's own requests carry: the test's credentials, unsigned.
const AUTHORIZATION: &str = "Authorization: AWS4-HMAC-SHA256 \
    Credential=drover-test/20261128/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00";

fn moto_dir() -> PathBuf {
    std::env::var_os("DROVER_MOTO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/drover-tools/moto-s3"))
}

/// An S3 server of its own on a loopback port, stopped when dropped.
struct S3Server {
    child: std::process::Child,
    port: u16,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl S3Server {
    async fn start() -> S3Server {
        let moto = moto_dir();
        assert!(
            moto.join("moto").is_dir(),
            "moto's S3 server is not installed in {} (scripts/setup.sh installs it)",
            moto.display()
        );
        let port = common::free_port();
        let child = std::process::Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .env("PYTHONPATH", &moto)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start python3 -m moto.server");
        let server = S3Server { child, port };
        let started = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(started.elapsed() < Duration::from_secs(60), "the S3 server did not listen on {port} within 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sends a bare HTTP request as the test's own hand, past drover's
    /// client: this server checks that a request names credentials, not its
    /// signature. Its status.
    async fn raw(&self, method: &str, path: &str, body: &[u8]) -> u16 {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{AUTHORIZATION}\r\nContent-Type: application/octet-stream\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer);
        answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status in {answer}"))
    }

    async fn get(&self, path: &str) -> Vec<u8> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.unwrap();
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{AUTHORIZATION}\r\nConnection: close\r\n\r\n",
            self.port
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        let split = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("an HTTP answer") + 4;
        answer.split_off(split)
    }
}

/// Runs `drover ARGS...` with the bucket's credentials and endpoint; its exit
/// status, stdout and stderr.
async fn drover(s3: &S3Server, args: &[&str]) -> (bool, String, String) {
    let endpoint = s3.endpoint();
    let envs = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "drover-test"),
        ("AWS_SECRET_ACCESS_KEY", "drover-test-secret"),
        ("AWS_REGION", "us-east-1"),
    ];
    common::run_drover(args, &envs).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backup_in_a_bucket_is_listed_verified_restored_refused_when_damaged_and_deleted() {
    let s3 = S3Server::start().await;
    assert_eq!(s3.raw("PUT", &format!("/{BUCKET}"), b"").await, 200, "creating the bucket");
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("node"), &[]);
    node.wait_ready().await;
    let client = node.client().await;
    for n in 0..50 {
        client.create_job("kept", &format!(r#"{{"n":{n},"pad":"{}"}}"#, "x".repeat(200))).await.unwrap();
    }
    let to = format!("s3://{BUCKET}/cluster-a");
    let (ok, out, err) = drover(&s3, &["backup", "create", "--to", &to, "--id", "b1", "-a", &node.grpc]).await;
    assert!(ok && out.contains("50 jobs"), "{out}\n{err}");
    let listing = String::from_utf8_lossy(&s3.get(&format!("/{BUCKET}?list-type=2")).await).into_owned();
    for object in ["cluster-a/b1/manifest.json", "cluster-a/b1/p0.snap"] {
        assert!(listing.contains(&format!("<Key>{object}</Key>")), "{object} is not in the bucket: {listing}");
    }
    let (ok, out, err) = drover(&s3, &["backup", "list", "--from", &to]).await;
    assert!(ok && out.contains("b1  complete") && out.contains("50 jobs"), "{out}\n{err}");
    let (ok, out, err) = drover(&s3, &["backup", "verify", "--from", &to, "--id", "b1"]).await;
    assert!(ok && out.contains("50 jobs"), "{out}\n{err}");
    let (ok, _, err) = drover(&s3, &["backup", "create", "--to", &to, "--id", "b1", "-a", &node.grpc]).await;
    assert!(!ok && err.contains("already exists"), "a backup is never overwritten: {err}");

    // Restored from the bucket into a new node's data directory.
    let restored = dir.path().join("restored");
    let restored_dir = restored.to_str().unwrap();
    let (ok, out, err) =
        drover(&s3, &["backup", "restore", "--from", &to, "--id", "b1", "--data-dir", restored_dir]).await;
    assert!(ok && out.contains("50 jobs"), "{out}\n{err}");
    assert!(restored.join("cluster.json").exists(), "a node can start on {restored_dir}");

    // A part damaged in the bucket is refused by verify and by restore.
    let part = s3.get(&format!("/{BUCKET}/cluster-a/b1/p0.snap")).await;
    let mut damaged = part.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x40;
    assert_eq!(s3.raw("PUT", &format!("/{BUCKET}/cluster-a/b1/p0.snap"), &damaged).await, 200);
    let (ok, _, err) = drover(&s3, &["backup", "verify", "--from", &to, "--id", "b1"]).await;
    assert!(!ok && err.contains("SHA-256"), "{err}");
    let elsewhere = dir.path().join("refused");
    let elsewhere = elsewhere.to_str().unwrap();
    let (ok, _, err) = drover(&s3, &["backup", "restore", "--from", &to, "--id", "b1", "--data-dir", elsewhere]).await;
    assert!(!ok && err.contains("SHA-256"), "{err}");

    // Deleted, it is gone from the bucket.
    let (ok, out, err) = drover(&s3, &["backup", "delete", "--from", &to, "--id", "b1"]).await;
    assert!(ok && out.contains("2 files"), "{out}\n{err}");
    let listing = String::from_utf8_lossy(&s3.get(&format!("/{BUCKET}?list-type=2")).await).into_owned();
    assert!(!listing.contains("<Key>"), "objects left after the delete: {listing}");
    let (ok, _, err) = drover(&s3, &["backup", "verify", "--from", &to, "--id", "b1"]).await;
    assert!(!ok && err.contains("there is no backup b1"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bucket_that_refuses_says_so_with_the_stores_own_words() {
    let s3 = S3Server::start().await;
    let to = "s3://no-such-bucket/x";
    let (ok, out, err) = drover(&s3, &["backup", "list", "--from", to]).await;
    assert!(!ok && err.contains("404") && err.contains("NoSuchBucket"), "{out}\n{err}");
    // Without credentials nothing is sent, and the message names what to set.
    let output = tokio::process::Command::new(common::drover_bin())
        .args(["backup", "list", "--from", to])
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && err.contains("AWS_ACCESS_KEY_ID"), "{err}");
}
