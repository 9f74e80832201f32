//! TLS on a node's three ports, with rustls (ring): certificates and keys
//! from PEM files, reloaded when the files change (as Kubernetes rotates a
//! mounted secret), so a rotation needs no restart.
//!
//! This module owns:
//! - [`ReloadingServer`]: a port's server configuration, rebuilt from its
//!   files when they change; on the cluster port it also requires a client
//!   certificate signed by the cluster CA (mutual TLS);
//! - [`accept`]: the connections a port serves, plaintext or after a TLS
//!   handshake done off the accept loop; a refused handshake is logged with
//!   the peer's address and never reaches a service;
//! - [`ReloadingClient`] and [`cluster_connector`]: how a node dials its peers
//!   over mutual TLS, with its own certificate and the cluster CA, both
//!   reloaded the same way.
//!
//! The files are polled for changes every [`RELOAD_EVERY`]: a renamed-in
//! file (Kubernetes swaps a symlink) changes too, and nothing else is needed.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context as _};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// How often certificate files are checked for changes.
pub const RELOAD_EVERY: Duration = Duration::from_secs(2);
/// A client that has not finished its handshake within this is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A port's certificate and key, and for mutual TLS the CA that signs the
/// certificates its clients must present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading certificates from {}", path.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("{} holds a malformed PEM certificate", path.display()))?;
    if certs.is_empty() {
        bail!("{} holds no PEM certificate", path.display());
    }
    Ok(certs)
}

fn private_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("{} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)", path.display()))
}

fn roots(path: &Path) -> anyhow::Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots.add(cert).with_context(|| format!("{} holds a certificate that is not a CA", path.display()))?;
    }
    Ok(Arc::new(roots))
}

/// When each file last changed and its length, as far as the file system says.
type Stamps = Vec<Option<(SystemTime, u64)>>;

/// A configuration built from files, and built again when they change.
struct FromFiles<C> {
    files: TlsFiles,
    build: fn(&TlsFiles) -> anyhow::Result<Arc<C>>,
    current: RwLock<(Arc<C>, Stamps)>,
}

impl<C> FromFiles<C> {
    fn load(files: TlsFiles, build: fn(&TlsFiles) -> anyhow::Result<Arc<C>>) -> anyhow::Result<Self> {
        let stamps = Self::stamps(&files);
        let config = build(&files)?;
        Ok(FromFiles { files, build, current: RwLock::new((config, stamps)) })
    }

    fn stamps(files: &TlsFiles) -> Stamps {
        let mut paths = vec![files.cert.as_path(), files.key.as_path()];
        paths.extend(files.client_ca.as_deref());
        paths
            .iter()
            .map(|p| std::fs::metadata(p).ok().map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len())))
            .collect()
    }

    fn get(&self) -> Arc<C> {
        Arc::clone(&self.current.read().expect("tls config lock").0)
    }

    /// Builds the configuration again if a file changed: `Ok(true)` when it
    /// did and now serves. A change that does not load (a half-written file,
    /// a key that does not match) keeps the old configuration; the next
    /// check tries again.
    fn reload_if_changed(&self) -> anyhow::Result<bool> {
        let now = Self::stamps(&self.files);
        if now == self.current.read().expect("tls config lock").1 {
            return Ok(false);
        }
        let config = (self.build)(&self.files)?;
        *self.current.write().expect("tls config lock") = (config, now);
        Ok(true)
    }
}
/// A server configuration that follows its files.
pub struct ReloadingServer {
    /// What the port is, for log lines ("gateway", "cluster", "admin").
    pub port: &'static str,
    config: FromFiles<ServerConfig>,
}

impl ReloadingServer {
    /// Loads `files` now; a missing or malformed file is an error at start.
    /// gRPC ports speak `h2`; with `http1`, `http/1.1` too.
    pub fn load(port: &'static str, files: TlsFiles, http1: bool) -> anyhow::Result<Arc<ReloadingServer>> {
        let build = if http1 { Self::build_http } else { Self::build_grpc };
        let config = FromFiles::load(files, build).with_context(|| format!("TLS on the {port} port"))?;
        Ok(Arc::new(ReloadingServer { port, config }))
    }

    fn build_grpc(files: &TlsFiles) -> anyhow::Result<Arc<ServerConfig>> {
        Self::build(files, &[b"h2"])
    }

    fn build_http(files: &TlsFiles) -> anyhow::Result<Arc<ServerConfig>> {
        Self::build(files, &[b"h2", b"http/1.1"])
    }

    fn build(files: &TlsFiles, alpn: &[&[u8]]) -> anyhow::Result<Arc<ServerConfig>> {
        let builder = ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
        let builder = match &files.client_ca {
            Some(ca) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                    .build()
                    .context("building the client certificate verifier")?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certificates(&files.cert)?, private_key(&files.key)?)
            .with_context(|| format!("{} does not match the key in {}", files.cert.display(), files.key.display()))?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }

    /// The configuration new connections get.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.config.get()
    }

    /// Rebuilds the configuration if a file changed; true when it did.
    pub fn reload_if_changed(&self) -> bool {
        match self.config.reload_if_changed() {
            Ok(true) => {
                let cert = self.config.files.cert.display();
                tracing::info!(port = self.port, %cert, "reloaded the TLS certificate");
                metrics::counter!("drover_tls_reloads_total", "port" => self.port).increment(1);
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(
                    port = self.port,
                    "the TLS files changed but do not load (kept the previous ones): {e:#}"
                );
                false
            }
        }
    }
}

/// A connection a port serves: plaintext, or after a TLS handshake.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Conn {
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.tcp().peer_addr().ok()
    }

    fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => s.get_ref().0,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.tcp().connect_info()
    }
}

/// The connections `listener` accepts, until `stop`: with `tls`, only those
/// whose handshake succeeds (each handshake runs on its own task, so a slow
/// or hostile client holds up no one). Every accepted socket gets
/// TCP_NODELAY: Nagle's algorithm with delayed ACKs holds small pushed
/// messages for up to 40 ms.
pub fn accept(
    listener: TcpListener,
    tls: Option<Arc<ReloadingServer>>,
    mut stop: watch::Receiver<bool>,
) -> mpsc::Receiver<io::Result<Conn>> {
    let (sender, receiver) = mpsc::channel(64);
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        tokio::pin!(stopped);
        let mut reload = tokio::time::interval(RELOAD_EVERY);
        reload.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors, say: wait a little, keep serving.
                        tracing::warn!("accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = reload.tick(), if tls.is_some() => {
                    if let Some(tls) = &tls {
                        tls.reload_if_changed();
                    }
                    continue;
                }
                _ = &mut stopped => return,
            };
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY on an accepted connection: {e}");
            }
            let Some(tls) = &tls else {
                if sender.send(Ok(Conn::Plain(stream))).await.is_err() {
                    return;
                }
                continue;
            };
            let (acceptor, port, sender) = (TlsAcceptor::from(tls.config()), tls.port, sender.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        let _ = sender.send(Ok(Conn::Tls(Box::new(stream)))).await;
                    }
                    Ok(Err(e)) => {
                        metrics::counter!("drover_tls_handshakes_refused_total", "port" => port).increment(1);
                        tracing::warn!(port, %peer, "refused a TLS connection: {e}");
                    }
                    Err(_) => {
                        metrics::counter!("drover_tls_handshakes_refused_total", "port" => port).increment(1);
                        tracing::warn!(port, %peer, "refused a TLS connection: no handshake within {HANDSHAKE_TIMEOUT:?}");
                    }
                }
            });
        }
    });
    receiver
}

/// A client configuration that follows its files: how a node dials its
/// peers, presenting its certificate and trusting only the cluster CA.
pub struct ReloadingClient {
    config: FromFiles<ClientConfig>,
}

impl ReloadingClient {
    /// `files.client_ca` is the CA peers' certificates must be signed by.
    pub fn load(files: TlsFiles) -> anyhow::Result<Arc<ReloadingClient>> {
        let config = FromFiles::load(files, Self::build).context("TLS to cluster peers")?;
        Ok(Arc::new(ReloadingClient { config }))
    }

    fn build(files: &TlsFiles) -> anyhow::Result<Arc<ClientConfig>> {
        let Some(ca) = &files.client_ca else { bail!("the cluster port's TLS needs the cluster CA") };
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots(ca)?)
            .with_client_auth_cert(certificates(&files.cert)?, private_key(&files.key)?)
            .with_context(|| format!("{} does not match the key in {}", files.cert.display(), files.key.display()))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    /// The configuration for the next connection, reloaded first if a file
    /// changed (dials are rare: channels live long).
    pub fn config(&self) -> Arc<ClientConfig> {
        if let Err(e) = self.config.reload_if_changed() {
            tracing::warn!("the cluster TLS files changed but do not load (kept the previous ones): {e:#}");
        }
        self.config.get()
    }
}

/// The server name a peer's certificate must carry for `host`.
fn server_name(host: &str) -> io::Result<ServerName<'static>> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host:?} is no TLS server name: {e}")))
}

/// A tonic connector that dials a peer over mutual TLS.
pub fn cluster_connector(
    client: Arc<ReloadingClient>,
) -> impl tower::Service<
    tonic::codegen::http::Uri,
    Response = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<TcpStream>>,
    Error = io::Error,
    Future = impl Send,
> + Clone
       + Send {
    tower::service_fn(move |uri: tonic::codegen::http::Uri| {
        let client = Arc::clone(&client);
        async move {
            let host = uri.host().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no host"))?.to_string();
            let port = uri.port_u16().unwrap_or(443);
            let tcp = TcpStream::connect((host.trim_start_matches('[').trim_end_matches(']'), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = TlsConnector::from(client.config()).connect(server_name(&host)?, tcp).await?;
            Ok(hyper_util::rt::TokioIo::new(tls))
        }
    })
}

/// A throwaway certificate authority: `drover dev-cluster --tls` makes one,
/// and so do the TLS tests. Never for production: its key lives in a file
/// next to the data.
pub struct DevCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl DevCa {
    pub fn new(name: &str) -> anyhow::Result<DevCa> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
        let issuer = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate()?)?;
        Ok(DevCa { issuer })
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `names` (host names or IP addresses), good both for
    /// serving and for dialing peers: (certificate PEM, private key PEM).
    pub fn issue(&self, names: &[&str]) -> anyhow::Result<(String, String)> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names)?;
        params.distinguished_name.push(rcgen::DnType::CommonName, "drover node");
        params.extended_key_usages =
            vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// Files [`write_dev_certificates`] wrote.
pub struct DevFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Writes a new CA (`ca.pem`) and a certificate for `names` that it signed
/// (`node.pem`, `node-key.pem`, readable by the owner only) into `dir`.
pub fn write_dev_certificates(dir: &Path, names: &[&str]) -> anyhow::Result<DevFiles> {
    std::fs::create_dir_all(dir)?;
    let ca = DevCa::new("drover dev cluster CA")?;
    let (cert, key) = ca.issue(names)?;
    let files = DevFiles { ca: dir.join("ca.pem"), cert: dir.join("node.pem"), key: dir.join("node-key.pem") };
    std::fs::write(&files.ca, ca.pem())?;
    std::fs::write(&files.cert, cert)?;
    write_private(&files.key, &key)?;
    Ok(files)
}

/// Writes `text` to a file only its owner may read.
pub fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

/// A GET over HTTPS/1.1 to `addr`, trusting the PEM CA `ca`: (status, body).
/// For the admin port of local clusters (bench, dev-cluster) and tests.
pub async fn https_get(addr: &str, path: &str, ca: &[u8]) -> io::Result<(u16, String)> {
    https_get_as(addr, path, ca, None).await
}

/// Like [`https_get`], sending `token` (if any) as a bearer token.
pub async fn https_get_as(addr: &str, path: &str, ca: &[u8], token: Option<&str>) -> io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidInput, e);
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        roots.add(cert.map_err(|e| invalid(e.to_string()))?).map_err(|e| invalid(e.to_string()))?;
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let tcp = TcpStream::connect(addr).await?;
    let mut stream = TlsConnector::from(Arc::new(config)).connect(server_name(host)?, tcp).await?;
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{authorization}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    // A server may close without TLS's close_notify; what arrived counts.
    let _ = stream.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((code, body))
}

/// An HTTP port's connections, plaintext or TLS, for axum (the admin port,
/// the OJS port).
pub struct HttpListener {
    connections: mpsc::Receiver<io::Result<Conn>>,
    local: Option<std::net::SocketAddr>,
}

impl HttpListener {
    pub fn new(listener: TcpListener, tls: Option<Arc<ReloadingServer>>, stop: watch::Receiver<bool>) -> Self {
        let local = listener.local_addr().ok();
        HttpListener { connections: accept(listener, tls, stop), local }
    }
}

impl axum::serve::Listener for HttpListener {
    type Io = Conn;
    type Addr = Option<std::net::SocketAddr>;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.connections.recv().await {
                Some(Ok(conn)) => {
                    let peer = conn.peer_addr();
                    return (conn, peer);
                }
                Some(Err(_)) => continue,
                // Stopping: the accept loop ended; axum's graceful shutdown ends the server.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
