//! The process's tracing subscriber: logs on stderr (text or JSON, filtered by the log
//! level or `RUST_LOG`), and with the `otlp` feature the request spans to an OTLP collector.

use anyhow::anyhow;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _, Registry};

use crate::config::{LogFormat, OtelSettings};

type LogLayer = Box<dyn tracing_subscriber::Layer<Registry> + Send + Sync>;
/// The export sits above the log layer (a layer in a `Vec` with its own filter never saw
/// a span).
type ExportLayer = Box<
    dyn tracing_subscriber::Layer<tracing_subscriber::layer::Layered<LogLayer, Registry>>
        + Send
        + Sync,
>;

/// What must outlive the process's work: the span exporter, flushed by
/// [`shutdown`](Telemetry::shutdown).
#[must_use = "call `shutdown` before exit, or spans still batched are lost"]
#[derive(Debug, Default)]
pub struct Telemetry {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still batched and stops the exporter. Call it while the runtime
    /// the exporter was made in still runs.
    pub fn shutdown(self) {
        #[cfg(feature = "otlp")]
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: trace export did not finish: {e}");
        }
    }
}

/// Installs the global subscriber. With `otel`, call it inside the Tokio runtime the
/// exporter should use (its gRPC channel runs there).
///
/// # Errors
/// A bad log filter, an exporter that cannot be built, or a subscriber already installed.
pub fn init(
    format: LogFormat,
    level: &str,
    otel: Option<&OtelSettings>,
) -> anyhow::Result<Telemetry> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(v),
        _ => EnvFilter::try_new(level),
    }
    .map_err(|e| anyhow!("log level `{level}`: {e}"))?;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs: LogLayer = match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            // The current span's fields are enough; the list would repeat them.
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .with_filter(filter)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .with_filter(filter)
            .boxed(),
    };
    let (export, telemetry): (Option<ExportLayer>, Telemetry) = match otel {
        None => (None, Telemetry::default()),
        #[cfg(feature = "otlp")]
        Some(otel) => {
            let (layer, provider) = otlp::layer(otel)?;
            let telemetry = Telemetry {
                provider: Some(provider),
            };
            (Some(layer), telemetry)
        }
        #[cfg(not(feature = "otlp"))]
        Some(otel) => anyhow::bail!(
            "`otel.endpoint` {} is set but this build has no OTLP export (cargo feature `otlp`)",
            otel.endpoint
        ),
    };
    tracing_subscriber::registry()
        .with(logs)
        .with(export)
        .try_init()
        .map_err(|e| anyhow!("{e}"))?;
    Ok(telemetry)
}

#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::filter::LevelFilter;

    use super::ExportLayer;
    use crate::config::OtelSettings;

    /// The layer that turns request spans into OpenTelemetry spans, batched to `otel`'s
    /// collector over OTLP/gRPC; the events logged inside a request go along as span events.
    pub(super) fn layer(otel: &OtelSettings) -> anyhow::Result<(ExportLayer, SdkTracerProvider)> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(otel.endpoint.clone())
            .build()
            .map_err(|e| anyhow::anyhow!("`otel.endpoint` {}: {e}", otel.endpoint))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(otel.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("idem");
        // INFO and up: the gateway's only spans are its request spans (tracing-opentelemetry
        // drops events outside a span). A target filter here (`Targets`, `filter_fn`) kept
        // every span from being exported, so the filter is by level only.
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(LevelFilter::INFO)
            .boxed();
        Ok((layer, provider))
    }
}
