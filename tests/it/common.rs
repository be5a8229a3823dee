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
        let dir = exe
            .parent()
            .and_then(|p| p.parent())
            .expect("target profile directory")
            .to_path_buf();
        let profile_release = dir.file_name().is_some_and(|n| n == "release");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "-p", "joader-tools", "--bin", "joader"]);
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

/// How long a test waits for a state before it fails. Reaching it is a failure of the code, never
/// something a test waits out, so it is far beyond what any state here takes on a loaded
/// machine (tests wait for states, never for times: see CODE_STYLE.md).
pub const DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// Polls `probe` until it returns `Some`, and returns that; fails naming `what` once
/// [`DEADLINE`] has passed.
pub fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "waited {DEADLINE:?} in vain for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits until the job `name` has `acknowledged` samples acknowledged (the server learns of a
/// client's last acknowledgements when it next polls the rings, which may be after the client
/// has exited) and returns the job's JSON.
pub fn wait_acknowledged(
    client: &joader_tools::client::Client,
    name: &str,
    acknowledged: u64,
) -> serde_json::Value {
    let start = std::time::Instant::now();
    let mut last = serde_json::Value::Null;
    loop {
        if let Ok(j) = client.ok("GET", &format!("/v1/jobs/{name}"), None) {
            if j["acknowledged"].as_u64() == Some(acknowledged) {
                return j;
            }
            last = j;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "waited {DEADLINE:?} in vain for job {name} to have {acknowledged} samples \
             acknowledged; last seen: {last}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Runs `joader` with `args`.
pub fn joader(args: &[&str]) -> Output {
    Command::new(joader_bin())
        .args(args)
        .output()
        .expect("run joader")
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

use std::collections::HashMap;
use std::io::Read;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use joader_tools::serve_process::{ServeLog, spawn_serve};
use serde_json::Value;

/// A unique shared-memory instance name for this test.
pub fn unique_instance(tag: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("it_{tag}_{}_{n}", std::process::id())
}

/// Objects this instance has in /dev/shm.
pub fn shm_objects(instance: &str) -> Vec<String> {
    let prefix = format!("joader-{instance}-");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// A `joader serve` child process on a free port.
pub struct TestServer {
    pub child: Option<Child>,
    /// Its shared-memory instance: what a killed server left is removed on drop.
    pub instance: String,
    pub url: String,
    /// What the server logged so far (printed when a test that used it fails).
    pub log: ServeLog,
}

impl TestServer {
    pub fn start(
        instance: &str,
        data_dir: &std::path::Path,
        root: &std::path::Path,
        extra: &[&str],
    ) -> TestServer {
        Self::start_env(instance, data_dir, root, extra, &[])
    }

    /// [`TestServer::start`] with `env` set, and no `AWS_*` variable but those of `env` (a
    /// test decides what credentials a server has).
    pub fn start_env(
        instance: &str,
        data_dir: &std::path::Path,
        root: &std::path::Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> TestServer {
        let mut cmd = Command::new(joader_bin());
        cmd.args(["serve", "--instance", instance]);
        if !extra.contains(&"--bind") {
            cmd.args(["--bind", "127.0.0.1:0"]);
        }
        // Defaults a test may override through `extra`.
        if !extra.contains(&"--cache-bytes") {
            cmd.args(["--cache-bytes", "256MiB"]); // a size as users write it (bytesize)
        }
        if !extra.contains(&"--cache-slots") {
            cmd.args(["--cache-slots", "4096"]);
        }
        cmd.arg("--data-dir")
            .arg(data_dir)
            .arg("--allowed-root")
            .arg(root)
            .args(extra)
            .env("JOADER_LOG", "info")
            // A stopped test server gives running jobs 5 s, not 30 (a flag overrides it).
            .env("JOADER_DRAIN_GRACE_S", "5");
        let started =
            spawn_serve(cmd, env, usize::MAX, DEADLINE).unwrap_or_else(|e| panic!("{e:#}"));
        TestServer {
            child: Some(started.child),
            instance: instance.to_string(),
            url: started.url,
            log: started.log,
        }
    }

    pub fn client(&self) -> joader_tools::client::Client {
        joader_tools::client::Client::new(self.url.clone())
    }

    /// Sends SIGTERM (the server drains, then stops) without waiting.
    pub fn sigterm(&self) {
        if let Some(child) = &self.child {
            let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }

    /// Waits for a server told to stop to exit (`what`: the state awaited), and checks that it
    /// exited successfully and left nothing of its instance in /dev/shm.
    pub fn exits_cleanly(&mut self, what: &str) {
        let child = self.child.as_mut().expect("a running server");
        let status = wait_for(what, || child.try_wait().unwrap());
        self.child = None; // reaped: nothing for the drop to stop
        assert!(status.success(), "{status:?}");
        assert!(shm_objects(&self.instance).is_empty(), "no segment is left");
    }

    /// SIGTERM, then waits; returns whether it exited successfully.
    pub fn stop(&mut self) -> bool {
        self.sigterm();
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
        // A test that killed its server (SIGKILL: no clean-up) leaves its segments in
        // /dev/shm; remove them, unless a restarted server of the instance runs.
        let _ = dataplane::remove_dead_instance(&self.instance);
        if std::thread::panicking() {
            eprintln!("---- joader serve log ----\n{}", self.log.text());
        }
    }
}

/// A consumer that [`consumer`] started: what [`finish`] needs to ask the server about its
/// job when it does not end.
struct Started {
    url: String,
    name: String,
    rank: String,
}

/// The consumers started and not finished yet, by process id.
fn consumers() -> &'static Mutex<HashMap<u32, Started>> {
    static C: OnceLock<Mutex<HashMap<u32, Started>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// Reads a child's pipe to its end on a thread of its own (a child blocks on a full pipe).
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    })
}

/// `joader consume` in its own process; [`finish`] waits for it and returns its JSON summary.
pub fn consumer(url: &str, job: &Value, extra: &[&str]) -> Child {
    let child = Command::new(joader_bin())
        .args(["consume", "--server", url, "--job", &job.to_string()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn joader consume");
    let name = job["name"].as_str().unwrap_or("(named by the server)");
    let rank = extra
        .iter()
        .position(|a| *a == "--rank")
        .and_then(|i| extra.get(i + 1))
        .unwrap_or(&"0");
    consumers().lock().unwrap().insert(
        child.id(),
        Started {
            url: url.to_string(),
            name: name.to_string(),
            rank: rank.to_string(),
        },
    );
    child
}

/// Waits for a [`consumer`] to exit and returns its JSON summary; fails when it failed, or
/// when it has not exited after [`DEADLINE`] (it is killed then), naming its job and the
/// state the server reports for it.
pub fn finish(child: Child) -> Value {
    finish_within(child, DEADLINE)
}

/// [`finish`] with a deadline of its own (a test of the deadline itself).
pub fn finish_within(child: Child, deadline: Duration) -> Value {
    let (job, out) = exit_within(child, deadline);
    assert!(
        out.status.success(),
        "{job}: consumer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("consumer summary")
}

/// Waits for a [`consumer`] to exit, successfully or not, and returns what it printed; fails
/// like [`finish`] when it has not exited after [`DEADLINE`].
pub fn outcome(child: Child) -> Output {
    exit_within(child, DEADLINE).1
}

/// Waits for a consumer to exit; returns its job (for messages) and what it printed. Fails
/// when it has not exited after `deadline` (it is killed then), naming its job and the state
/// the server reports for it.
fn exit_within(mut child: Child, deadline: Duration) -> (String, Output) {
    let who = consumers().lock().unwrap().remove(&child.id());
    let job = who
        .as_ref()
        .map(|w| format!("job {} rank {}", w.name, w.rank))
        .unwrap_or_else(|| format!("consumer {}", child.id()));
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for joader consume") {
            break status;
        }
        if start.elapsed() >= deadline {
            // Asked before the kill: a killed client fails its job.
            let state = who.as_ref().map_or_else(
                || "unknown (not started by `consumer`)".to_string(),
                |w| {
                    joader_tools::consume::job_state(
                        &joader_tools::client::Client::new(w.url.clone()),
                        &w.name,
                    )
                },
            );
            let _ = child.kill();
            let _ = child.wait();
            let err = stderr.join().unwrap_or_default();
            panic!(
                "{job}: joader consume has not finished after {deadline:?}; the server says: \
                 {state}\n---- its stderr ----\n{}",
                String::from_utf8_lossy(&err)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = Output {
        status,
        stdout: stdout.join().expect("read the consumer's output"),
        stderr: stderr.join().expect("read the consumer's errors"),
    };
    (job, out)
}

/// The server's `/metrics` text.
pub fn scrape(url: &str) -> String {
    ureq::get(format!("{url}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap()
}

/// A series' value in a `/metrics` text (`name{labels}` exactly as rendered).
pub fn series(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}
