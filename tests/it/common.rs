//! Helpers shared by the integration tests.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Path of the `joader` binary of this build profile, built once per test process.
pub fn joader_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // target/<profile>/deps/it-<hash> -> target/<profile>/joader
        let exe = std::env::current_exe().expect("test executable path");
        let dir = exe.parent().and_then(|p| p.parent()).expect("target profile directory").to_path_buf();
        let profile_release = dir.file_name().is_some_and(|n| n == "release");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "-p", "server", "--bin", "joader"]);
        if profile_release {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build");
        assert!(status.success(), "building the joader binary failed");
        let bin = dir.join("joader");
        assert!(bin.exists(), "{} does not exist", bin.display());
        bin
    })
    .clone()
}

/// Runs `joader` with `args`.
pub fn joader(args: &[&str]) -> Output {
    Command::new(joader_bin()).args(args).output().expect("run joader")
}

/// A unique temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("joader-it-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
