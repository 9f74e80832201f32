//! The Rust client and worker library. Depends only on tonic and the generated
//! contract: a worker application can use it with `default-features = false`.

mod history;
pub mod leaders;
mod worker;

use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

pub use history::describe_event;
pub use worker::{Control, JobOutcome, Worker, WorkerOptions};

use crate::proto::gateway::gateway_client::GatewayClient;
use crate::proto::gateway::*;

/// A connection to any Drover node's gateway.
#[derive(Clone)]
pub struct Client {
    inner: GatewayClient<InterceptedService<Channel, Bearer>>,
    channel: Channel,
}

/// The environment variable holding the bearer token a client sends (a
/// tokens-file secret or a JWT); none is sent without it.
pub const TOKEN_ENV: &str = "DROVER_TOKEN";

/// Adds `authorization: Bearer <token>` to every call, when there is a token.
#[derive(Clone, Default)]
pub struct Bearer {
    header: Option<MetadataValue<Ascii>>,
}

impl Bearer {
    /// A token, or `None` for no header. A token that cannot be a header
    /// value (a newline in it) is refused here rather than on every call.
    pub fn new(token: Option<&str>) -> Result<Bearer, tonic::Status> {
        let header = match token.map(str::trim).filter(|t| !t.is_empty()) {
            Some(token) => Some(format!("Bearer {token}").parse().map_err(|_| {
                tonic::Status::invalid_argument("the token holds characters a gRPC header cannot carry")
            })?),
            None => None,
        };
        Ok(Bearer { header })
    }

    /// [`TOKEN_ENV`]'s token, if set and usable.
    pub fn from_env() -> Bearer {
        Bearer::new(std::env::var(TOKEN_ENV).ok().as_deref()).unwrap_or_default()
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(header) = &self.header {
            request.metadata_mut().insert("authorization", header.clone());
        }
        Ok(request)
    }
}

/// Turns `host:port` into `http://host:port`; keeps full URLs as they are.
pub fn endpoint_url(address: &str) -> String {
    if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    }
}

/// The environment variable naming a PEM file of the CA that signs the
/// gateways' certificates, for `https://` addresses. Without it, the public
/// web's roots are trusted.
pub const TLS_CA_ENV: &str = "DROVER_TLS_CA";

/// An endpoint for `address`: TLS for `https://` addresses, verified against
/// the CA in [`TLS_CA_ENV`] (or the public web's roots).
pub fn endpoint(address: &str) -> Result<Endpoint, tonic::transport::Error> {
    let ca = std::env::var_os(TLS_CA_ENV).and_then(|path| std::fs::read(path).ok());
    endpoint_with_ca(address, ca.as_deref())
}

/// An endpoint for `address`: TLS for `https://` addresses, verified against
/// the PEM CA `ca` (or, without one, the public web's roots).
pub fn endpoint_with_ca(address: &str, ca: Option<&[u8]>) -> Result<Endpoint, tonic::transport::Error> {
    let url = endpoint_url(address.trim());
    let endpoint = Endpoint::from_shared(url.clone())?;
    if !url.starts_with("https://") {
        return Ok(endpoint);
    }
    let tls = tonic::transport::ClientTlsConfig::new();
    let tls = match ca {
        Some(pem) => tls.ca_certificate(tonic::transport::Certificate::from_pem(pem)),
        None => tls.with_webpki_roots(),
    };
    endpoint.tls_config(tls)
}

impl Client {
    /// Connects lazily: the first call opens the connection, and a lost
    /// connection is re-established by the next call. Several gateways,
    /// comma separated, are balanced: calls go to the ones that answer, so a
    /// worker keeps its session (and its jobs) when one gateway dies.
    pub fn connect_lazy(address: &str) -> Result<Client, tonic::transport::Error> {
        let endpoint = |address: &str| -> Result<Endpoint, tonic::transport::Error> {
            Ok(self::endpoint(address)?
                .connect_timeout(Duration::from_secs(3))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(20))
                .keep_alive_while_idle(true))
        };
        if !address.contains(',') {
            return Ok(Client::from_channel(endpoint(address)?.connect_lazy()));
        }
        let endpoints = address.split(',').filter(|a| !a.trim().is_empty()).map(endpoint);
        let endpoints: Vec<Endpoint> = endpoints.collect::<Result<_, _>>()?;
        Ok(Client::from_channel(Channel::balance_list(endpoints.into_iter())))
    }

    /// Connects now, failing if the node cannot be reached.
    pub async fn connect(address: &str) -> Result<Client, tonic::transport::Error> {
        Self::connect_with_ca(address, None).await
    }

    /// Like [`Client::connect`], trusting the PEM CA `ca` for an `https://`
    /// address (without one: [`TLS_CA_ENV`]'s, or the public web's roots).
    pub async fn connect_with_ca(address: &str, ca: Option<&[u8]>) -> Result<Client, tonic::transport::Error> {
        let endpoint = match ca {
            Some(ca) => endpoint_with_ca(address, Some(ca))?,
            None => endpoint(address)?,
        };
        let channel = endpoint.connect_timeout(Duration::from_secs(3)).tcp_nodelay(true).connect().await?;
        Ok(Client::from_channel(channel))
    }

    /// A client on `channel`, sending [`TOKEN_ENV`]'s token if set.
    pub fn from_channel(channel: Channel) -> Client {
        Client::with_bearer(channel, Bearer::from_env())
    }

    pub fn with_bearer(channel: Channel, bearer: Bearer) -> Client {
        let inner = GatewayClient::with_interceptor(channel.clone(), bearer).max_decoding_message_size(64 << 20);
        Client { inner, channel }
    }

    /// The same connection, sending `token` (a tokens-file secret or a JWT).
    pub fn with_token(&self, token: &str) -> Result<Client, tonic::Status> {
        let bearer = Bearer::new(Some(token))?;
        Ok(Client::with_bearer(self.channel.clone(), bearer))
    }

    /// The generated client, for calls this wrapper does not cover.
    pub fn raw(&self) -> GatewayClient<InterceptedService<Channel, Bearer>> {
        self.inner.clone()
    }

    /// Creates a job of `job_type` with JSON `variables`; returns its key.
    pub async fn create_job(&self, job_type: &str, variables: &str) -> Result<u64, tonic::Status> {
        let request = CreateJobRequest { r#type: job_type.into(), variables: variables.into(), ..Default::default() };
        Ok(self.raw().create_job(request).await?.into_inner().key)
    }

    pub async fn create(&self, request: CreateJobRequest) -> Result<u64, tonic::Status> {
        Ok(self.raw().create_job(request).await?.into_inner().key)
    }

    /// Completes the activation `attempt` of job `key` (ActivatedJob.attempt).
    pub async fn complete(&self, key: u64, attempt: u32, variables: &str) -> Result<(), tonic::Status> {
        let request = CompleteJobRequest { key, attempt, variables: variables.into(), override_fence: false };
        self.raw().complete_job(request).await?;
        Ok(())
    }

    /// An operator's completion of job `key` whatever its attempt, over the
    /// worker that holds it: needs `jobs:manage:<type>`, and the job's history
    /// names the caller.
    pub async fn complete_overriding(&self, key: u64, variables: &str) -> Result<(), tonic::Status> {
        let request = CompleteJobRequest { key, attempt: 0, variables: variables.into(), override_fence: true };
        self.raw().complete_job(request).await?;
        Ok(())
    }

    /// Completes with the caller's W3C `traceparent` in the request metadata,
    /// so the broker's completion span joins that trace.
    pub async fn complete_traced(
        &self,
        key: u64,
        attempt: u32,
        variables: &str,
        traceparent: &str,
    ) -> Result<(), tonic::Status> {
        let completion = CompleteJobRequest { key, attempt, variables: variables.into(), override_fence: false };
        let mut request = tonic::Request::new(completion);
        if let Ok(value) = traceparent.parse() {
            if !traceparent.is_empty() {
                request.metadata_mut().insert("traceparent", value);
            }
        }
        self.raw().complete_job(request).await?;
        Ok(())
    }

    pub async fn fail(
        &self,
        key: u64,
        attempt: u32,
        retries: i32,
        error_message: &str,
        retry_back_off_ms: i64,
    ) -> Result<(), tonic::Status> {
        self.fail_for("failed", key, attempt, retries, error_message, retry_back_off_ms).await
    }

    /// Fails an attempt for a reason (`failed`, `malformed-payload`,
    /// `resource-unavailable`, `intermittent`, `worker-shutdown`,
    /// `internal-error`); see `FailJobRequest.reason`.
    pub async fn fail_for(
        &self,
        reason: &str,
        key: u64,
        attempt: u32,
        retries: i32,
        error_message: &str,
        retry_back_off_ms: i64,
    ) -> Result<(), tonic::Status> {
        let request = FailJobRequest {
            key,
            attempt,
            retries,
            error_message: error_message.into(),
            retry_back_off: retry_back_off_ms,
            variables: String::new(),
            reason: reason.into(),
            override_fence: false,
            ..Default::default()
        };
        self.raw().fail_job(request).await?;
        Ok(())
    }

    /// Fails an attempt as the job's retry policy decides (see
    /// `FailJobRequest.by_policy`): `error_type` is matched against the
    /// policy's non-retryable errors. Answers what was decided.
    pub async fn fail_by_policy(
        &self,
        key: u64,
        attempt: u32,
        error_type: &str,
        error_message: &str,
    ) -> Result<FailJobResponse, tonic::Status> {
        let request = FailJobRequest {
            key,
            attempt,
            error_message: error_message.into(),
            by_policy: true,
            error_type: error_type.into(),
            // An older gateway refuses this instead of failing the job for good.
            retries: -1,
            ..Default::default()
        };
        Ok(self.raw().fail_job(request).await?.into_inner())
    }

    pub async fn get_job(&self, key: u64) -> Result<Job, tonic::Status> {
        let reply = self.raw().get_job(GetJobRequest { key, ..Default::default() }).await?.into_inner();
        reply.job.ok_or_else(|| tonic::Status::internal("GetJob returned no job"))
    }

    /// Waits up to `timeout` for a job to be final; returns it and whether it is.
    pub async fn await_job(&self, key: u64, timeout: Duration) -> Result<(Job, bool), tonic::Status> {
        let request = AwaitJobRequest { key, timeout: timeout.as_millis() as i64, ..Default::default() };
        let mut stream = self.raw().await_job(request).await?.into_inner();
        let reply = stream.message().await?.ok_or_else(|| tonic::Status::internal("AwaitJob sent no answer"))?;
        let job = reply.job.ok_or_else(|| tonic::Status::internal("AwaitJob returned no job"))?;
        Ok((job, reply.r#final))
    }

    /// Commits `stage` of an activated job with `variables` (a JSON object,
    /// empty for none); returns the activation's new deadline.
    pub async fn checkpoint(&self, job: &ActivatedJob, stage: &str, variables: &str) -> Result<i64, tonic::Status> {
        let request = CheckpointJobRequest {
            key: job.key,
            attempt: job.attempt,
            stage: stage.into(),
            variables: variables.into(),
        };
        Ok(self.raw().checkpoint_job(request).await?.into_inner().deadline)
    }

    /// Activates up to `max` jobs, waiting up to `request_timeout_ms` for one.
    pub async fn activate(
        &self,
        job_type: &str,
        worker: &str,
        max: i32,
        timeout_ms: i64,
        request_timeout_ms: i64,
    ) -> Result<Vec<ActivatedJob>, tonic::Status> {
        let request = ActivateJobsRequest {
            r#type: job_type.into(),
            worker: worker.into(),
            timeout: timeout_ms,
            max_jobs_to_activate: max,
            request_timeout: request_timeout_ms,
            ..Default::default()
        };
        let mut grpc = tonic::Request::new(request);
        grpc.set_timeout(Duration::from_millis(request_timeout_ms.max(0) as u64 + 10_000));
        let mut stream = self.raw().activate_jobs(grpc).await?.into_inner();
        let mut jobs = Vec::new();
        while let Some(reply) = stream.message().await? {
            jobs.extend(reply.jobs);
        }
        Ok(jobs)
    }

    pub async fn topology(&self) -> Result<TopologyResponse, tonic::Status> {
        Ok(self.raw().topology(TopologyRequest {}).await?.into_inner())
    }
}
