//! TLS on every port of real `drover serve` processes: a three-node cluster
//! serves jobs over TLS, refuses plaintext, and takes rotated certificates
//! without a restart; the cluster port refuses peers without a certificate
//! from the cluster CA, and says so in its log.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{eventually, NodeProcess, ProcessCluster};
use drover::client::Client;
use drover::tls::{https_get, write_private, DevCa};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A CA and a certificate for 127.0.0.1 it signed, as files.
struct Certificates {
    _dir: tempfile::TempDir,
    authority: DevCa,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Certificates {
    fn new() -> Certificates {
        let dir = tempfile::tempdir().unwrap();
        let authority = DevCa::new("test cluster CA").unwrap();
        let (ca, cert, key) = (dir.path().join("ca.pem"), dir.path().join("node.pem"), dir.path().join("node-key.pem"));
        std::fs::write(&ca, authority.pem()).unwrap();
        let certificates = Certificates { _dir: dir, authority, ca, cert, key };
        certificates.rotate();
        certificates
    }

    /// Replaces the node certificate and key with new ones from the same CA,
    /// each file renamed into place whole; answers the new certificate (DER).
    fn rotate(&self) -> Vec<u8> {
        let (cert, key) = self.authority.issue(&["127.0.0.1", "localhost"]).unwrap();
        let (cert_next, key_next) = (self.cert.with_extension("next"), self.key.with_extension("next"));
        std::fs::write(&cert_next, &cert).unwrap();
        write_private(&key_next, &key).unwrap();
        std::fs::rename(&key_next, &self.key).unwrap();
        std::fs::rename(&cert_next, &self.cert).unwrap();
        CertificateDer::from_pem_slice(cert.as_bytes()).unwrap().to_vec()
    }

    fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(&self.ca).unwrap()
    }

    /// `drover serve` arguments: TLS on all three ports, mutual on the cluster port.
    fn serve_args(&self) -> Vec<String> {
        let path = |p: &Path| p.display().to_string();
        vec![
            "--tls-cert".into(),
            path(&self.cert),
            "--tls-key".into(),
            path(&self.key),
            "--cluster-tls-cert".into(),
            path(&self.cert),
            "--cluster-tls-key".into(),
            path(&self.key),
            "--cluster-tls-ca".into(),
            path(&self.ca),
        ]
    }
}

/// A TLS connection to `addr` trusting `ca`, presenting `identity` if given.
async fn tls_connect(
    addr: &str,
    ca: &[u8],
    identity: Option<(&[u8], &[u8])>,
    alpn: &[u8],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert).map(Result::unwrap).collect(),
                PrivateKeyDer::from_pem_slice(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await
}

/// The certificate a TLS port presents now (DER).
async fn served_certificate(addr: &str, ca: &[u8], identity: Option<(&[u8], &[u8])>) -> Option<Vec<u8>> {
    // Bounded: a handshake a port never finishes is no certificate.
    let stream =
        tokio::time::timeout(Duration::from_secs(5), tls_connect(addr, ca, identity, b"h2")).await.ok()?.ok()?;
    Some(stream.get_ref().1.peer_certificates()?.first()?.to_vec())
}

/// Creates a job, activates and completes it over `client`, retrying the
/// create while the cluster elects a leader.
async fn serve_one_job(client: &Client, job_type: &str) {
    let started = Instant::now();
    let key = loop {
        match client.create_job(job_type, r#"{"over":"tls"}"#).await {
            Ok(key) => break key,
            Err(e) => {
                assert!(started.elapsed() < Duration::from_secs(60), "no create over TLS within 60 s: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let job = client.activate(job_type, "tls-worker", 1, 60_000, 5_000).await.expect("activate").remove(0);
    client.complete(job.key, job.attempt, r#"{"done":true}"#).await.expect("complete");
    assert_eq!(client.get_job(key).await.unwrap().state, "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_tls_on_every_port_serves_jobs_refuses_plaintext_and_takes_rotated_certificates() {
    let certificates = Certificates::new();
    let args = certificates.serve_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = ProcessCluster::start(3, 2, 3, &args);
    let ca = certificates.ca_pem();
    for id in 0..3 {
        let admin = cluster.node(id).admin.clone();
        let ca = ca.clone();
        eventually(Duration::from_secs(60), "every node to be ready over HTTPS", || {
            let (admin, ca) = (admin.clone(), ca.clone());
            async move { https_get(&admin, "/ready", &ca).await.is_ok_and(|(code, _)| code == 200) }
        })
        .await;
    }
    let gateway = format!("https://{}", cluster.node(0).grpc);
    let client = Client::connect_with_ca(&gateway, Some(&ca)).await.expect("a TLS client connects");
    serve_one_job(&client, "tls-before").await;

    // Plaintext is refused on every port. A refused client may retry or
    // wait on a closed connection; unanswered within 10 s is not served.
    let bound = Duration::from_secs(10);
    let plain = async {
        match Client::connect(&cluster.node(1).grpc).await {
            Err(_) => true,
            Ok(plain) => plain.create_job("plain", "{}").await.is_err(),
        }
    };
    let refused = tokio::time::timeout(bound, plain).await.unwrap_or(true);
    assert!(refused, "a plaintext client was served by a TLS gateway port");
    let plain_admin = tokio::time::timeout(bound, common::http_get(&cluster.node(1).admin, "/ready")).await;
    assert!(
        !plain_admin.is_ok_and(|answer| answer.is_ok_and(|(code, _)| code == 200)),
        "the admin port answered plaintext HTTP"
    );

    // Rotation: new files, the same paths, no restart.
    let before = served_certificate(&cluster.node(2).grpc, &ca, None).await.expect("a TLS handshake");
    let rotated = certificates.rotate();
    assert_ne!(before, rotated);
    let cert = std::fs::read(&certificates.cert).unwrap();
    let key = std::fs::read(&certificates.key).unwrap();
    for id in 0..3 {
        for (port, addr, identity) in [
            ("gateway", cluster.node(id).grpc.clone(), None),
            ("cluster", cluster.node(id).cluster.clone(), Some((cert.as_slice(), key.as_slice()))),
            ("admin", cluster.node(id).admin.clone(), None),
        ] {
            let (ca, rotated) = (ca.clone(), rotated.clone());
            eventually(
                Duration::from_secs(30),
                &format!("node {id}'s {port} port to present the new certificate"),
                || {
                    let (addr, ca, rotated) = (addr.clone(), ca.clone(), rotated.clone());
                    async move { served_certificate(&addr, &ca, identity).await.is_some_and(|c| c == rotated) }
                },
            )
            .await;
        }
    }
    serve_one_job(&client, "tls-after").await;
    let fresh = Client::connect_with_ca(&format!("https://{}", cluster.node(1).grpc), Some(&ca)).await.unwrap();
    serve_one_job(&fresh, "tls-fresh").await;
    for (id, node) in cluster.nodes.iter_mut().enumerate() {
        let node = node.as_mut().expect("started");
        assert!(node.child.try_wait().unwrap().is_none(), "node {id} kept running through the rotation");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_port_refuses_peers_without_a_certificate_from_the_cluster_ca_and_logs_it() {
    let certificates = Certificates::new();
    let dir = tempfile::tempdir().unwrap();
    let args = certificates.serve_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut node, stderr) = NodeProcess::start_capturing_stderr(dir.path(), &args, &[]);
    let ca = certificates.ca_pem();
    let cluster_port = node.cluster.clone();

    // A peer of this cluster is served.
    let cert = std::fs::read(&certificates.cert).unwrap();
    let key = std::fs::read(&certificates.key).unwrap();
    assert!(served_certificate(&cluster_port, &ca, Some((&cert, &key))).await.is_some());
    assert!(talks_h2(&cluster_port, &ca, Some((&cert, &key))).await, "a peer with the cluster's certificate is served");

    // No certificate, or one from another CA: refused before anything is read.
    assert!(!talks_h2(&cluster_port, &ca, None).await, "a peer without a client certificate was served");
    let stranger = DevCa::new("another CA").unwrap();
    let (their_cert, their_key) = stranger.issue(&["127.0.0.1"]).unwrap();
    assert!(
        !talks_h2(&cluster_port, &ca, Some((their_cert.as_bytes(), their_key.as_bytes()))).await,
        "a peer with another CA's certificate was served"
    );

    // The node refuses on its own task; wait until it has counted both
    // refusals before stopping it, so that their log lines are written.
    let admin = node.admin.clone();
    eventually(Duration::from_secs(20), "the node to count both refusals", || {
        let (admin, ca) = (admin.clone(), ca.clone());
        async move {
            let Ok((200, metrics)) = https_get(&admin, "/metrics", &ca).await else { return false };
            metrics
                .lines()
                .find(|l| l.starts_with("drover_tls_handshakes_refused_total{port=\"cluster\"}"))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .is_some_and(|count| count >= 2.0)
        }
    })
    .await;
    node.kill();
    let log = stderr.join().unwrap();
    let refusals: Vec<&str> = log.lines().filter(|l| l.contains("refused a TLS connection")).collect();
    assert!(refusals.len() >= 2, "both refusals are logged:\n{log}");
    assert!(refusals.iter().all(|l| l.contains("cluster") && l.contains("127.0.0.1")), "{refusals:?}");
    assert!(!log.contains("serving PLAINTEXT"), "every port had TLS:\n{log}");
}

/// Whether the port completes a TLS handshake with this identity and then
/// answers an HTTP/2 preface with its own: with TLS 1.3 a client learns that
/// its certificate was refused only when it reads.
async fn talks_h2(addr: &str, ca: &[u8], identity: Option<(&[u8], &[u8])>) -> bool {
    let Ok(mut stream) = tls_connect(addr, ca, identity, b"h2").await else { return false };
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    if stream.write_all(preface).await.is_err() || stream.flush().await.is_err() {
        return false;
    }
    let mut header = [0u8; 9];
    match tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut header)).await {
        // The server's first frame is its SETTINGS (type 4).
        Ok(Ok(_)) => header[3] == 4,
        _ => false,
    }
}
