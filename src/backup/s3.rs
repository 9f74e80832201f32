//! An S3-compatible object store as a backup destination (`s3://BUCKET/PREFIX`):
//! the few calls backups need (put, get, list, delete an object), signed with
//! AWS Signature Version 4, over HTTP/1.1 with TLS (webpki roots) or plain
//! HTTP to a local endpoint.
//!
//! Credentials and place come from the usual environment:
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`
//! (optional), `AWS_REGION` or `AWS_DEFAULT_REGION` (default `us-east-1`),
//! and `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` for a store other than
//! AWS (MinIO, Ceph, Garage, ...). With an endpoint given, buckets are
//! addressed by path (`ENDPOINT/BUCKET/KEY`), which every S3-compatible
//! store serves; on AWS by virtual host (`BUCKET.s3.REGION.amazonaws.com`).
//! `DROVER_S3_PATH_STYLE=true|false` overrides that choice.
//!
//! Every body is signed by its SHA-256, so the store refuses one that
//! arrives altered. An object is put in one request (up to S3's 5 GiB
//! limit; a larger part is refused before it is sent).

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use ring::hmac;

/// The largest object one PUT may carry.
const MAX_PUT_BYTES: u64 = 5 << 30;
/// How long one request may take to answer (a part's upload included).
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

type Body = BoxBody<Bytes, std::io::Error>;

/// What a request carries: its body, with the SHA-256 (hex) it is signed
/// by and its length.
struct Payload {
    body: Body,
    sha256: String,
    length: Option<u64>,
}

impl Payload {
    fn none() -> Payload {
        let body = Full::new(Bytes::new()).map_err(|never| match never {}).boxed();
        Payload { body, sha256: hex_sha256(b""), length: None }
    }
}

/// A bucket, a prefix within it, and how to reach and sign for it.
pub struct Bucket {
    bucket: String,
    /// Ends with `/` unless empty.
    prefix: String,
    region: String,
    key_id: String,
    secret: String,
    session_token: Option<String>,
    tls: bool,
    /// host or host:port, as the `Host` header names it.
    host: String,
    port: u16,
    path_style: bool,
}

impl std::fmt::Display for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl Bucket {
    /// The bucket `s3://BUCKET[/PREFIX]` names, reached as the environment says.
    pub fn from_url(spec: &str) -> anyhow::Result<Bucket> {
        let rest = spec.strip_prefix("s3://").context("an S3 destination is s3://BUCKET/PREFIX")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() || !bucket.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c)) {
            bail!("{spec}: {bucket:?} is not a bucket name (letters, digits, '-', '.', '_')");
        }
        let prefix = prefix.trim_matches('/');
        let prefix = if prefix.is_empty() { String::new() } else { format!("{prefix}/") };
        let missing = |name: &str| {
            format!("{spec}: set {name} (and AWS_SECRET_ACCESS_KEY, AWS_REGION, and for a store other than AWS, AWS_ENDPOINT_URL)")
        };
        let key_id = env("AWS_ACCESS_KEY_ID").with_context(|| missing("AWS_ACCESS_KEY_ID"))?;
        let secret = env("AWS_SECRET_ACCESS_KEY").with_context(|| missing("AWS_SECRET_ACCESS_KEY"))?;
        let region = env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")).unwrap_or_else(|| "us-east-1".into());
        let endpoint = env("AWS_ENDPOINT_URL_S3").or_else(|| env("AWS_ENDPOINT_URL"));
        let path_style = match env("DROVER_S3_PATH_STYLE").as_deref() {
            Some("true") => true,
            Some("false") => false,
            Some(other) => bail!("DROVER_S3_PATH_STYLE is {other:?}: say true or false"),
            None => endpoint.is_some(),
        };
        let (tls, host, port) = match &endpoint {
            Some(url) => {
                let (tls, authority) = if let Some(a) = url.strip_prefix("https://") {
                    (true, a)
                } else if let Some(a) = url.strip_prefix("http://") {
                    (false, a)
                } else {
                    bail!("the S3 endpoint {url} is not an http:// or https:// URL");
                };
                let authority = authority.trim_end_matches('/');
                if authority.contains('/') {
                    bail!("the S3 endpoint {url} has a path; give only scheme, host and port");
                }
                let port = match authority.rsplit_once(':') {
                    Some((_, port)) => port.parse().with_context(|| format!("the S3 endpoint {url} has a bad port"))?,
                    None if tls => 443,
                    None => 80,
                };
                (tls, authority.to_string(), port)
            }
            None => (true, format!("s3.{region}.amazonaws.com"), 443),
        };
        let host = if path_style { host } else { format!("{bucket}.{host}") };
        Ok(Bucket {
            bucket: bucket.to_string(),
            prefix,
            region,
            key_id,
            secret,
            session_token: env("AWS_SESSION_TOKEN"),
            tls,
            host,
            port,
            path_style,
        })
    }

    /// The object name of `name` under the prefix.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Puts the file at `path`, of `size` bytes with SHA-256 `sha256` (hex),
    /// as object `key`.
    pub async fn put_file(&self, key: &str, path: &Path, (size, sha256): (u64, String)) -> anyhow::Result<()> {
        if size > MAX_PUT_BYTES {
            bail!("{} is {size} bytes; an S3 object put in one request holds at most {MAX_PUT_BYTES}", path.display());
        }
        let file = tokio::fs::File::open(path).await?;
        let chunks = futures::stream::unfold(file, |mut file| async move {
            use tokio::io::AsyncReadExt as _;
            let mut buffer = vec![0u8; 1 << 20];
            match file.read(&mut buffer).await {
                Ok(0) => None,
                Ok(n) => {
                    buffer.truncate(n);
                    Some((Ok(Frame::data(Bytes::from(buffer))), file))
                }
                Err(e) => Some((Err(e), file)),
            }
        });
        let payload = Payload { body: StreamBody::new(chunks).boxed(), sha256, length: Some(size) };
        self.expect_ok("PUT", key, &[], payload).await.map(drop)
    }

    pub async fn put_bytes(&self, key: &str, bytes: Vec<u8>) -> anyhow::Result<()> {
        let (sha256, length) = (hex_sha256(&bytes), Some(bytes.len() as u64));
        let body = Full::new(Bytes::from(bytes)).map_err(|never| match never {}).boxed();
        self.expect_ok("PUT", key, &[], Payload { body, sha256, length }).await.map(drop)
    }

    /// Object `key`'s bytes; `None` if there is none.
    pub async fn get_bytes(&self, key: &str) -> anyhow::Result<Option<Vec<u8>>> {
        let response = self.send("GET", key, &[], Payload::none()).await?;
        if response.status() == hyper::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let (status, body) = read_all(response).await?;
        if !status.is_success() {
            bail!("{}", self.failure("GET", key, status, &body));
        }
        Ok(Some(body))
    }

    /// Object `key` copied into an unnamed temporary file, rewound; `None`
    /// if there is none.
    pub async fn get_file(&self, key: &str) -> anyhow::Result<Option<std::fs::File>> {
        use tokio::io::AsyncWriteExt as _;
        let response = self.send("GET", key, &[], Payload::none()).await?;
        let status = response.status();
        if status == hyper::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            let (_, body) = read_all(response).await?;
            bail!("{}", self.failure("GET", key, status, &body));
        }
        let mut file = tokio::fs::File::from_std(tempfile::tempfile().context("creating a temporary file")?);
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.with_context(|| format!("reading {self} {key}"))?.into_data() {
                file.write_all(&data).await?;
            }
        }
        file.flush().await?;
        let mut file = file.into_std().await;
        std::io::Seek::rewind(&mut file)?;
        Ok(Some(file))
    }

    /// The object names under `prefix` (whole names) and, with a
    /// `delimiter`, the names' common prefixes up to it.
    pub async fn list(&self, prefix: &str, delimiter: Option<&str>) -> anyhow::Result<(Vec<String>, Vec<String>)> {
        let (mut keys, mut prefixes) = (Vec::new(), Vec::new());
        let mut token: Option<String> = None;
        loop {
            let mut query =
                vec![("list-type".to_string(), "2".to_string()), ("prefix".to_string(), prefix.to_string())];
            if let Some(d) = delimiter {
                query.push(("delimiter".to_string(), d.to_string()));
            }
            if let Some(t) = &token {
                query.push(("continuation-token".to_string(), t.clone()));
            }
            let body = self.expect_ok("GET", "", &query, Payload::none()).await?;
            let xml = String::from_utf8_lossy(&body);
            for block in elements(&xml, "Contents") {
                keys.extend(elements(block, "Key").into_iter().map(unescape));
            }
            for block in elements(&xml, "CommonPrefixes") {
                prefixes.extend(elements(block, "Prefix").into_iter().map(unescape));
            }
            let truncated = elements(&xml, "IsTruncated").first().is_some_and(|t| *t == "true");
            token = elements(&xml, "NextContinuationToken").first().map(|t| unescape(t));
            if !truncated || token.is_none() {
                return Ok((keys, prefixes));
            }
        }
    }

    pub async fn delete(&self, key: &str) -> anyhow::Result<()> {
        self.expect_ok("DELETE", key, &[], Payload::none()).await.map(drop)
    }

    /// Sends a request and reads its answer whole; an error unless it is a success.
    async fn expect_ok(
        &self,
        method: &str,
        key: &str,
        query: &[(String, String)],
        payload: Payload,
    ) -> anyhow::Result<Vec<u8>> {
        let response = self.send(method, key, query, payload).await?;
        let (status, body) = read_all(response).await?;
        if !status.is_success() {
            bail!("{}", self.failure(method, key, status, &body));
        }
        Ok(body)
    }

    fn failure(&self, method: &str, key: &str, status: hyper::StatusCode, body: &[u8]) -> String {
        let xml = String::from_utf8_lossy(body);
        let code = elements(&xml, "Code").first().map(|c| unescape(c)).unwrap_or_default();
        let message = elements(&xml, "Message").first().map(|m| unescape(m)).unwrap_or_default();
        format!("S3 {method} s3://{}/{key} answered {status} {code}: {message}", self.bucket)
    }

    async fn send(
        &self,
        method: &str,
        key: &str,
        query: &[(String, String)],
        payload: Payload,
    ) -> anyhow::Result<hyper::Response<hyper::body::Incoming>> {
        let Payload { body, sha256, length } = payload;
        let sha256 = sha256.as_str();
        let path = match (self.path_style, key) {
            (true, "") => format!("/{}/", self.bucket),
            (true, key) => format!("/{}/{}", self.bucket, encode(key, false)),
            (false, key) => format!("/{}", encode(key, false)),
        };
        let mut pairs: Vec<(String, String)> = query.iter().map(|(k, v)| (encode(k, true), encode(v, true))).collect();
        pairs.sort();
        let canonical_query = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&");
        let (date, time) = now_utc();
        let stamp = format!("{date}T{time}Z");
        let mut headers = vec![
            ("host".to_string(), self.host.clone()),
            ("x-amz-content-sha256".to_string(), sha256.to_string()),
            ("x-amz-date".to_string(), stamp.clone()),
        ];
        if let Some(token) = &self.session_token {
            headers.push(("x-amz-security-token".to_string(), token.clone()));
        }
        headers.sort();
        let authorization = self.authorization(method, &path, &canonical_query, &headers, sha256, &stamp);
        let uri = if canonical_query.is_empty() { path } else { format!("{path}?{canonical_query}") };
        let mut builder = hyper::Request::builder().method(method).uri(uri).header("authorization", authorization);
        for (name, value) in &headers {
            builder = builder.header(name, value);
        }
        if let Some(length) = length {
            builder = builder.header("content-length", length);
        }
        let request = builder.body(body).context("building an S3 request")?;
        let what = || format!("S3 {method} {self} (host {}:{})", self.host, self.port);
        tokio::time::timeout(REQUEST_TIMEOUT, self.round_trip(request))
            .await
            .map_err(|_| anyhow::anyhow!("no answer in {REQUEST_TIMEOUT:?}"))
            .and_then(|answer| answer)
            .with_context(what)
    }

    /// The `Authorization` header of a request (AWS Signature Version 4):
    /// `headers` are the signed ones, sorted, with lower-case names;
    /// `stamp` is their `x-amz-date`.
    fn authorization(
        &self,
        method: &str,
        path: &str,
        canonical_query: &str,
        headers: &[(String, String)],
        sha256: &str,
        stamp: &str,
    ) -> String {
        let date = &stamp[..8];
        let signed = headers.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(";");
        let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{}\n", v.trim())).collect();
        let request = format!("{method}\n{path}\n{canonical_query}\n{canonical_headers}\n{signed}\n{sha256}");
        let scope = format!("{date}/{}/s3/aws4_request", self.region);
        let to_sign = format!("AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{}", hex_sha256(request.as_bytes()));
        let mut signing = hmac_sha256(format!("AWS4{}", self.secret).as_bytes(), date.as_bytes());
        for part in [self.region.as_str(), "s3", "aws4_request"] {
            signing = hmac_sha256(&signing, part.as_bytes());
        }
        let signature = hex(&hmac_sha256(&signing, to_sign.as_bytes()));
        format!("AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}", self.key_id)
    }

    /// One request on a connection of its own: backups make few and large ones.
    async fn round_trip(
        &self,
        request: hyper::Request<Body>,
    ) -> anyhow::Result<hyper::Response<hyper::body::Incoming>> {
        let connect_to = self.host.rsplit_once(':').map_or(self.host.as_str(), |(host, _)| host);
        let tcp = tokio::net::TcpStream::connect((connect_to, self.port)).await?;
        if self.tls {
            let mut roots = rustls::RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            let config =
                rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                    .with_safe_default_protocol_versions()?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
            let name = rustls::pki_types::ServerName::try_from(connect_to.to_string())?;
            let tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
            exchange(hyper_util::rt::TokioIo::new(tls), request).await
        } else {
            exchange(hyper_util::rt::TokioIo::new(tcp), request).await
        }
    }
}

async fn exchange<T>(io: T, request: hyper::Request<Body>) -> anyhow::Result<hyper::Response<hyper::body::Incoming>>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("an S3 connection ended: {e}");
        }
    });
    Ok(sender.send_request(request).await?)
}

async fn read_all(response: hyper::Response<hyper::body::Incoming>) -> anyhow::Result<(hyper::StatusCode, Vec<u8>)> {
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes().to_vec();
    Ok((status, body))
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data).as_ref().to_vec()
}

fn hex_sha256(data: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, data).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    super::hex(bytes)
}

/// URI-encodes `s` as SigV4 asks: every byte but unreserved ones, and `/`
/// too unless `slash` is false (object names keep their slashes).
fn encode(s: &str, slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            b'/' if !slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The text of each `<tag>...</tag>` in `xml`, in order (S3's answers
/// nest no element in one of the same name).
fn elements<'a>(xml: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut found = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else { break };
        found.push(&after[..end]);
        rest = &after[end + close.len()..];
    }
    found
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&")
}

/// Today's date (`YYYYMMDD`) and the time (`HHMMSS`), UTC.
fn now_utc() -> (String, String) {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (year, month, day, h, m, s) = super::civil(secs);
    (format!("{year:04}{month:02}{day:02}"), format!("{h:02}{m:02}{s:02}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signing_keys_and_encodings_follow_sigv4() {
        // AWS's published example of deriving a signing key (the
        // Signature Version 4 documentation, "Examples of how to derive a
        // signing key").
        let mut key = hmac_sha256(b"AWS4wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", b"20120215");
        for part in ["us-east-1", "iam", "aws4_request"] {
            key = hmac_sha256(&key, part.as_bytes());
        }
        assert_eq!(hex(&key), "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d");
        assert_eq!(encode("a b/c~d", false), "a%20b/c~d");
        assert_eq!(encode("a b/c", true), "a%20b%2Fc");
        let xml = "<R><Contents><Key>a&amp;b</Key></Contents><Contents><Key>c</Key></Contents></R>";
        let keys: Vec<String> =
            elements(xml, "Contents").iter().flat_map(|c| elements(c, "Key")).map(unescape).collect();
        assert_eq!(keys, ["a&b", "c"]);
    }

    #[test]
    fn a_request_is_signed_as_aws_signs_its_published_example() {
        // The "GET Bucket (List Objects)" example of AWS's Signature Version
        // 4 documentation for S3 (a signature botocore computes alike).
        let bucket = Bucket {
            bucket: "examplebucket".into(),
            prefix: String::new(),
            region: "us-east-1".into(),
            key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
            tls: true,
            host: "examplebucket.s3.amazonaws.com".into(),
            port: 443,
            path_style: false,
        };
        let empty = hex_sha256(b"");
        assert_eq!(empty, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        let headers = [
            ("host".to_string(), bucket.host.clone()),
            ("x-amz-content-sha256".to_string(), empty.clone()),
            ("x-amz-date".to_string(), "20130524T000000Z".to_string()),
        ];
        assert_eq!(
            bucket.authorization("GET", "/", "max-keys=2&prefix=J", &headers, &empty, "20130524T000000Z"),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;x-amz-content-sha256;x-amz-date, \
             Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
        );
    }

    #[test]
    fn a_destination_says_what_it_lacks() {
        let error = Bucket::from_url("s3://").err().expect("no bucket").to_string();
        assert!(error.contains("not a bucket name"), "{error}");
    }
}
