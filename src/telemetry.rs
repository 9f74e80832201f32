//! Logs and traces: a `tracing` subscriber with `RUST_LOG`-style filtering,
//! human-readable or JSON lines, and OTLP trace export when an endpoint is set
//! (none otherwise: no exporter retrying a collector that is not there).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keeps the trace exporter alive; shut it down on exit to flush spans.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the global subscriber. Call once, inside a Tokio runtime.
pub fn init(log_format: &str, otlp_endpoint: Option<&str>, service_name: &str) -> anyhow::Result<Telemetry> {
    let filter = || {
        EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new("info,openraft=warn,h2=warn,tower=warn,hyper=warn"))
    };
    let fmt_layer = match log_format {
        // Logs go to stderr: stdout is for what a command prints (keys, JSON).
        "json" => tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr).with_filter(filter()).boxed(),
        _ => tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter()).boxed(),
    };
    let (otel_layer, provider) = match otlp_endpoint {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic().with_endpoint(endpoint).build()?;
            let provider = SdkTracerProvider::builder()
                .with_resource(Resource::builder().with_service_name(service_name.to_string()).build())
                .with_batch_exporter(exporter)
                .build();
            let tracer = provider.tracer("drover");
            opentelemetry::global::set_text_map_propagator(
                opentelemetry_sdk::propagation::TraceContextPropagator::new(),
            );
            let layer = tracing_opentelemetry::layer().with_tracer(tracer).with_filter(EnvFilter::new("info"));
            crate::trace_context::set_exporting(true);
            (Some(layer), Some(provider))
        }
        None => (None, None),
    };
    tracing_subscriber::registry().with(fmt_layer).with(otel_layer).try_init()?;
    Ok(Telemetry { provider })
}
