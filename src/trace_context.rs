//! W3C trace context carried with a job: the `traceparent` of the request that
//! created it is stored with the job, and the broker's activation and
//! completion spans and the worker's span continue that trace.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported; per-job spans are only made when they are.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

pub fn set_exporting(on: bool) {
    EXPORTING.store(on, Ordering::Relaxed);
}

fn propagator() -> opentelemetry_sdk_free::TraceContext {
    opentelemetry_sdk_free::TraceContext
}

/// Makes `span` a child of the trace named by `traceparent` (ignored if empty
/// or malformed).
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    if traceparent.is_empty() {
        return;
    }
    let carrier: HashMap<String, String> = [("traceparent".to_string(), traceparent.to_string())].into();
    let cx = propagator().extract(&carrier);
    let _ = span.set_parent(cx);
}

/// The `traceparent` of `span`, empty if it belongs to no exported trace.
pub fn traceparent_of(span: &tracing::Span) -> String {
    let mut carrier: HashMap<String, String> = HashMap::new();
    propagator().inject_context(&span.context(), &mut carrier);
    carrier.remove("traceparent").unwrap_or_default()
}

/// Records a `job.activate` span per activated job, in the job's trace.
#[cfg(feature = "server")]
pub fn activation_spans(partition: crate::core::PartitionId, jobs: &[crate::core::ActivatedJobData]) {
    if !exporting() {
        return;
    }
    for job in jobs {
        let span = tracing::info_span!("job.activate", key = job.key.0, attempt = job.attempt, partition, worker = %job.worker);
        continue_trace(&span, &job.spec.traceparent);
        span.in_scope(|| {});
    }
}

/// The W3C propagator, written against the `opentelemetry` API crate alone so
/// a worker application need not pull in the SDK.
mod opentelemetry_sdk_free {
    use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
    use opentelemetry::Context;

    #[derive(Debug)]
    pub struct TraceContext;

    static FIELDS: std::sync::LazyLock<[String; 1]> = std::sync::LazyLock::new(|| ["traceparent".to_string()]);

    impl TextMapPropagator for TraceContext {
        fn inject_context(&self, cx: &Context, injector: &mut dyn Injector) {
            let span = cx.span();
            let sc = span.span_context();
            if sc.is_valid() {
                let flags = sc.trace_flags() & TraceFlags::SAMPLED;
                injector.set("traceparent", format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), flags.to_u8()));
            }
        }

        fn extract_with_context(&self, cx: &Context, extractor: &dyn Extractor) -> Context {
            let Some(value) = extractor.get("traceparent") else { return cx.clone() };
            let parts: Vec<&str> = value.trim().split('-').collect();
            if parts.len() != 4 || parts[0] != "00" || parts[1].len() != 32 || parts[2].len() != 16 {
                return cx.clone();
            }
            let (Ok(trace_id), Ok(span_id), Ok(flags)) =
                (TraceId::from_hex(parts[1]), SpanId::from_hex(parts[2]), u8::from_str_radix(parts[3], 16))
            else {
                return cx.clone();
            };
            let sc = SpanContext::new(trace_id, span_id, TraceFlags::new(flags), true, TraceState::default());
            if !sc.is_valid() {
                return cx.clone();
            }
            cx.with_remote_span_context(sc)
        }

        fn fields(&self) -> opentelemetry::propagation::text_map_propagator::FieldIter<'_> {
            opentelemetry::propagation::text_map_propagator::FieldIter::new(&*FIELDS)
        }
    }
}
