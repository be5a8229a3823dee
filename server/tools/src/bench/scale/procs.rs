//! The processes `joader bench scale` runs and measures from outside: `joader serve` and
//! `joader consume` children of the current executable, their memory and CPU read from
//! `/proc/<pid>` (with `procfs`), and the generated manifest of hard links.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustix::process::{Pid, Signal, kill_process};
use serde_json::Value;

use crate::client::Client;
use crate::serve_process::{ServeChild, spawn_serve};

/// How long the bench waits for a state (a server up, a job past some batches) before it
/// gives up with an error naming what it waited for.
pub const DEADLINE: Duration = Duration::from_secs(600);

/// Polls `probe` every 20 ms until it gives a value; an error naming `what` after
/// [`DEADLINE`].
pub fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = probe()? {
            return Ok(v);
        }
        if start.elapsed() > DEADLINE {
            bail!("waited {DEADLINE:?} in vain for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, sig: Signal) {
    if let Some(pid) = Pid::from_raw(child.id() as i32) {
        let _ = kill_process(pid, sig);
    }
}

/// Anonymous resident memory (`RssAnon`) of a process, in bytes.
pub fn rss_anon(pid: u32) -> Result<u64> {
    let status = procfs::process::Process::new(pid as i32)?.status()?;
    Ok(status.rssanon.context("no RssAnon in /proc/<pid>/status")? * 1024)
}

/// User + system CPU seconds of a process so far.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = procfs::process::Process::new(pid as i32)?.stat()?;
    Ok((stat.utime + stat.stime) as f64 / procfs::ticks_per_second().max(1) as f64)
}

/// A `joader serve` child on a free port with its own instance and catalog directory. Dropping
/// it stops it (SIGTERM, SIGKILL after 20 s) and removes whatever it left in `/dev/shm`.
pub struct ServerProc {
    child: Child,
    pub url: String,
    pub instance: String,
    /// Its flags but `--bind` (instance and data folder included) and its `AWS_*`
    /// environment: what [`ServerProc::restart`] starts again.
    flags: Vec<OsString>,
    env: Vec<(String, String)>,
    _data: tempfile::TempDir,
}

/// `joader serve --bind <bind>` with `flags` and `env`, logging at `info`.
fn spawn(bind: &str, flags: &[OsString], env: &[(String, String)]) -> Result<ServeChild> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["serve", "--bind", bind])
        .args(flags)
        .env("JOADER_LOG", "info");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    spawn_serve(cmd, &env, 200, DEADLINE)
}

impl ServerProc {
    pub fn start(tag: &str, roots: &[PathBuf], cache_bytes: u64) -> Result<Self> {
        Self::start_with(tag, roots, cache_bytes, &[], &[])
    }

    /// [`ServerProc::start`] with more flags, and an environment whose `AWS_*` variables are
    /// `env`'s only (the object-store credentials a server reads).
    pub fn start_with(
        tag: &str,
        roots: &[PathBuf],
        cache_bytes: u64,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let instance = format!("bench_scale_{tag}_{}", std::process::id());
        let data = tempfile::Builder::new()
            .prefix("joader-bench-scale-catalog")
            .tempdir()?;
        let mut flags: Vec<OsString> = vec![
            "--instance".into(),
            instance.clone().into(),
            "--cache-bytes".into(),
            cache_bytes.to_string().into(),
            "--drain-grace-s".into(),
            "1".into(),
            "--data-dir".into(),
            data.path().into(),
        ];
        for r in roots {
            flags.extend(["--allowed-root".into(), r.into()]);
        }
        flags.extend(args.iter().map(OsString::from));
        let env: Vec<(String, String)> = env
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let started = spawn("127.0.0.1:0", &flags, &env)?;
        Ok(ServerProc {
            child: started.child,
            url: started.url,
            instance,
            flags,
            env,
            _data: data,
        })
    }

    /// Kills the server (SIGKILL: a crash) and starts it again at once on its address,
    /// instance and data folder, with its flags; returns when it was dead.
    pub fn restart(&mut self) -> Result<Instant> {
        let addr = self.url.trim_start_matches("http://").to_owned();
        let _ = self.child.kill();
        self.child.wait()?;
        let killed = Instant::now();
        self.child = spawn(&addr, &self.flags, &self.env)?.child;
        Ok(killed)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn client(&self) -> Client {
        Client::new(self.url.clone())
    }

    /// `RssAnon` once it has stopped moving by more than 64 KiB over 300 ms (freed memory
    /// returned), or after 5 s.
    pub fn settled_rss(&self) -> Result<u64> {
        let start = Instant::now();
        let mut last = rss_anon(self.pid())?;
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = rss_anon(self.pid())?;
            if now.abs_diff(last) <= 64 << 10 || start.elapsed() > Duration::from_secs(5) {
                return Ok(now);
            }
            last = now;
        }
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        signal(&self.child, Signal::TERM);
        let start = Instant::now();
        while !matches!(self.child.try_wait(), Ok(Some(_))) {
            if start.elapsed() > Duration::from_secs(20) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // A server that had to be killed leaves its segments.
        let prefix = format!("joader-{}-", self.instance);
        if let Ok(dir) = std::fs::read_dir("/dev/shm") {
            for e in dir.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

/// `joader consume` children. Dropping the set resumes and kills those still running.
#[derive(Default)]
pub struct Consumers {
    children: Vec<(String, Child, PathBuf)>,
}

impl Consumers {
    /// Starts a consumer that registers `job` (its JSON) and reads it, sleeping `sample_us`
    /// per sample; its output goes to files in `dir`.
    pub fn start(&mut self, url: &str, job: &Value, sample_us: u64, dir: &Path) -> Result<()> {
        let name = job["name"]
            .as_str()
            .context("a job without a name")?
            .to_owned();
        self.start_rank(&name, url, job, 0, sample_us, dir)
    }

    /// A consumer of rank `rank` of `job`, known (and its output files named) as `label`.
    pub fn start_rank(
        &mut self,
        label: &str,
        url: &str,
        job: &Value,
        rank: u32,
        sample_us: u64,
        dir: &Path,
    ) -> Result<()> {
        let name = label.to_owned();
        let out = dir.join(format!("{name}.out"));
        let child = Command::new(std::env::current_exe()?)
            .args(["consume", "--server", url, "--job", &job.to_string()])
            .args(["--rank", &rank.to_string()])
            .args(["--sample-us", &sample_us.to_string()])
            .stdout(Stdio::from(File::create(&out)?))
            .stderr(Stdio::from(File::create(dir.join(format!("{name}.err")))?))
            .spawn()
            .context("cannot start joader consume")?;
        self.children.push((name, child, out));
        Ok(())
    }

    fn find(&mut self, name: &str) -> Result<&mut (String, Child, PathBuf)> {
        self.children
            .iter_mut()
            .find(|c| c.0 == name)
            .with_context(|| format!("no consumer {name}"))
    }

    pub fn pause(&mut self, name: &str) -> Result<()> {
        signal(&self.find(name)?.1, Signal::STOP);
        Ok(())
    }

    /// Waits for consumer `name` to end and returns its JSON summary.
    pub fn finish(&mut self, name: &str) -> Result<Value> {
        let (_, child, out) = self.find(name)?;
        let status = wait_for(&format!("consumer {name} to end"), || Ok(child.try_wait()?))?;
        let text = std::fs::read_to_string(&*out)?;
        if !status.success() {
            let err = std::fs::read_to_string(out.with_extension("err")).unwrap_or_default();
            bail!("consumer {name} failed ({status}): {err}");
        }
        serde_json::from_str(text.trim())
            .with_context(|| format!("consumer {name} printed {text:?}"))
    }
}

impl Drop for Consumers {
    fn drop(&mut self) {
        for (_, child, _) in &mut self.children {
            if matches!(child.try_wait(), Ok(None)) {
                signal(child, Signal::CONT);
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Writes `root/train/nXXXXXXXX/nXXXXXXXX_N.JPEG` hard links to a few small JPEGs (ext4
/// allows 65,000 links per file) and `root/train.csv` listing them with their class (1000
/// classes, ImageNet's layout and path lengths), unless `root` already holds them for
/// `items`. Every item is a distinct path and directory entry, as in the real dataset.
pub fn generate_manifest(root: &Path, items: u64) -> Result<PathBuf> {
    const CLASSES: u64 = 1000;
    const LINKS_PER_FILE: u64 = 60_000;
    let manifest = root.join("train.csv");
    let marker = root.join(".joader-scale.json");
    let want = serde_json::json!({ "items": items, "version": 1 }).to_string();
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == want) && manifest.is_file() {
        return Ok(manifest);
    }
    let _ = std::fs::remove_file(&marker);
    let _ = std::fs::remove_dir_all(root.join("train"));
    let base = root.join("base");
    let spec = crate::synth::SynthSpec {
        classes: 1,
        per_class: items.div_ceil(LINKS_PER_FILE).max(8) as u32,
        width: 160,
        height: 120,
        quality: 85,
        seed: 7,
    };
    crate::synth::generate_image_folder(&base, &spec, &mut |_| {})?;
    let mut out = BufWriter::new(File::create(&manifest)?);
    writeln!(out, "path,label")?;
    let per_class = items.div_ceil(CLASSES);
    for i in 0..items {
        let (class, n) = (i / per_class, i % per_class);
        let dir = format!("train/n{:08}", 1_440_764 + class);
        let rel = format!("{dir}/n{:08}_{n}.JPEG", 1_440_764 + class);
        if n == 0 {
            std::fs::create_dir_all(root.join(&dir))?;
        }
        let src = crate::synth::image_path(&base, 0, (i % u64::from(spec.per_class)) as u32);
        std::fs::hard_link(&src, root.join(&rel))
            .with_context(|| format!("cannot link {}", rel))?;
        writeln!(out, "{rel},{class}")?;
    }
    out.flush()?;
    std::fs::write(&marker, want)?;
    Ok(manifest)
}
