//! The build: its version and the store backends compiled into it, for `idem --version`
//! and the `idem_build_info` metric.

use std::sync::OnceLock;

/// The store URL schemes this build can open, in the order `--version` prints them.
pub fn stores() -> Vec<&'static str> {
    let mut stores = vec!["memory"];
    if cfg!(feature = "sqlite") {
        stores.push("sqlite");
    }
    if cfg!(feature = "redis") {
        stores.extend(["redis", "redis+cluster"]);
    }
    if cfg!(feature = "postgres") {
        stores.push("postgres");
    }
    if cfg!(feature = "mysql") {
        stores.push("mysql");
    }
    stores
}

/// Optional features compiled in besides the stores.
pub fn features() -> Vec<&'static str> {
    let mut features = Vec::new();
    if cfg!(feature = "otlp") {
        features.push("otlp");
    }
    features
}

/// What `idem --version` prints after the name: `0.1.0 (stores: memory, sqlite, …)`.
pub fn version_line() -> &'static str {
    static LINE: OnceLock<String> = OnceLock::new();
    LINE.get_or_init(|| {
        let mut line = format!(
            "{} (stores: {}",
            env!("CARGO_PKG_VERSION"),
            stores().join(", ")
        );
        let features = features();
        if !features.is_empty() {
            line.push_str("; features: ");
            line.push_str(&features.join(", "));
        }
        line.push(')');
        line
    })
}

/// Sets `idem_build_info{version, stores, features} 1` in the installed recorder.
pub fn record_build_info() {
    metrics::gauge!(
        "idem_build_info",
        "version" => env!("CARGO_PKG_VERSION"),
        "stores" => stores().join(","),
        "features" => features().join(","),
    )
    .set(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_names_every_compiled_store() {
        let line = version_line();
        assert!(line.starts_with(env!("CARGO_PKG_VERSION")), "{line}");
        assert!(line.contains("memory"), "{line}");
        assert_eq!(line.contains("sqlite"), cfg!(feature = "sqlite"), "{line}");
        assert_eq!(
            line.contains("redis+cluster"),
            cfg!(feature = "redis"),
            "{line}"
        );
        assert_eq!(line.contains("postgres"), cfg!(feature = "postgres"));
        assert_eq!(line.contains("mysql"), cfg!(feature = "mysql"));
    }
}
