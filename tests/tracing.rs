//! One trace follows a job from the producer through the broker to the worker:
//! a real OTLP/gRPC receiver runs inside the test and collects the spans the
//! node and the Rust worker export.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::LocalNode;
use drover::client::{JobOutcome, Worker, WorkerOptions};
use drover::proto::gateway::CreateJobRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use tokio_stream::wrappers::TcpListenerStream;

#[derive(Clone, Default)]
struct Receiver {
    /// (trace id hex, span name)
    spans: Arc<Mutex<Vec<(String, String)>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    let trace_id: String = span.trace_id.iter().map(|b| format!("{b:02x}")).collect();
                    spans.push((trace_id, span.name));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producers_trace_reaches_the_broker_and_the_worker() {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let server = tonic::transport::Server::builder().add_service(TraceServiceServer::new(receiver.clone()));
    tokio::spawn(server.serve_with_incoming(TcpListenerStream::new(listener)));
    let telemetry = drover::telemetry::init("text", Some(&endpoint), "drover-test").unwrap();

    let node = LocalNode::start().await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut request = tonic::Request::new(CreateJobRequest { r#type: "traced".into(), ..Default::default() });
    request.metadata_mut().insert("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01").parse().unwrap());
    let key = node.client.raw().create_job(request).await.unwrap().into_inner().key;

    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<String>();
    let done_tx = Arc::new(Mutex::new(Some(done_tx)));
    let worker = Worker::new(node.client.clone(), WorkerOptions::new("traced"));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let worker_task = tokio::spawn(worker.run(
        move |job| {
            let done_tx = Arc::clone(&done_tx);
            async move {
                if let Some(tx) = done_tx.lock().unwrap().take() {
                    let _ = tx.send(job.traceparent.clone());
                }
                JobOutcome::Complete("{}".into())
            }
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    let handed = tokio::time::timeout(Duration::from_secs(10), done_rx).await.unwrap().unwrap();
    assert!(handed.contains(trace_id), "the activated job carries the producer's traceparent: {handed}");
    common::eventually(Duration::from_secs(10), "the job to be completed", || {
        let client = node.client.clone();
        async move { client.get_job(key).await.map(|j| j.state == "completed").unwrap_or(false) }
    })
    .await;
    let _ = stop_tx.send(());
    let _ = worker_task.await;

    tokio::task::spawn_blocking(move || telemetry.shutdown()).await.unwrap();
    let spans = receiver.spans.lock().unwrap().clone();
    let in_trace: Vec<&str> = spans.iter().filter(|(t, _)| t == trace_id).map(|(_, n)| n.as_str()).collect();
    eprintln!("spans in trace {trace_id}: {in_trace:?}");
    for name in ["gateway.create_job", "job.activate", "gateway.complete_job", "job.work"] {
        assert!(
            in_trace.contains(&name),
            "span {name} is in the producer's trace; spans in it: {in_trace:?}; all: {spans:?}"
        );
    }
}
