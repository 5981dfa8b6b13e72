//! Finding the `idem` binary: `--idem PATH`, else `IDEM_BIN`, else `idem` next to the running
//! executable (`target/<profile>/idem` for the `idem-chaos` binary, one level up from
//! `target/<profile>/deps/` for a test), built with `cargo build -p idem-gateway --bin idem`
//! when it is missing there. A run with a planted bug takes `idem-planted` from the same
//! place (`IDEM_PLANTED_BIN` names another), built with `--features planted-bugs` each time
//! (cargo does nothing when it is up to date).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The `idem` binary to run: `explicit` if given, else `IDEM_BIN`, else the build next to
/// this executable (built first if it is missing).
///
/// # Errors
/// The named binary does not exist, or cargo could not build it.
pub fn locate(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        return existing(path.to_path_buf(), "--idem");
    }
    if let Some(path) = std::env::var_os("IDEM_BIN") {
        return existing(PathBuf::from(path), "IDEM_BIN");
    }
    let profile_dir = profile_dir()?;
    let candidate = profile_dir.join("idem");
    if candidate.is_file() {
        return Ok(candidate);
    }
    build(&profile_dir, "idem", &[])?;
    existing(candidate, "the build")
}

/// The `idem-planted` binary: `IDEM_PLANTED_BIN`, else built (or found up to date) next to
/// this executable.
///
/// # Errors
/// The named binary does not exist, or cargo could not build it.
pub fn locate_planted() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("IDEM_PLANTED_BIN") {
        return existing(PathBuf::from(path), "IDEM_PLANTED_BIN");
    }
    let profile_dir = profile_dir()?;
    build(
        &profile_dir,
        "idem-planted",
        &["--features", "planted-bugs"],
    )?;
    existing(profile_dir.join("idem-planted"), "the build")
}

/// `target/<profile>` of the running executable.
fn profile_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("where this executable is")?;
    let dir = exe.parent().context("this executable has no directory")?;
    // `target/<profile>/idem-chaos`, or `target/<profile>/deps/<test>-<hash>`.
    Ok(if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().context("deps/ has no parent")?
    } else {
        dir
    }
    .to_path_buf())
}

fn existing(path: PathBuf, from: &str) -> anyhow::Result<PathBuf> {
    if path.is_file() {
        Ok(path)
    } else {
        bail!("no idem binary at {} (from {from})", path.display())
    }
}

/// Builds `bin` into the target directory `profile_dir` belongs to, with that profile.
fn build(profile_dir: &Path, bin: &str, extra: &[&str]) -> anyhow::Result<()> {
    let target = profile_dir
        .parent()
        .context("the profile directory has no parent")?;
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let what = format!(
        "cargo build -p idem-gateway --bin {bin} {} --profile {profile}",
        extra.join(" ")
    );
    eprintln!("idem-chaos: {what}");
    let status = Command::new(&cargo)
        .arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["-p", "idem-gateway", "--bin", bin, "--profile", profile])
        .args(extra)
        .arg("--target-dir")
        .arg(target)
        .status()
        .with_context(|| format!("running {}", Path::new(&cargo).display()))?;
    if !status.success() {
        bail!("{what} failed: {status}");
    }
    Ok(())
}
