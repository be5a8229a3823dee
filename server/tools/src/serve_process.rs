//! A `joader serve` child process, as the integration tests (`TestServer`) and `bench scale` /
//! `bench cluster` (`ServerProc`) start it: no `AWS_*` variable but those the caller gives (a
//! caller decides what credentials a server has), stderr read on a thread that keeps the log
//! and finds the address the server logs when it listens (`addr=HOST:PORT`, so that port 0
//! works).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// The last lines a server logged (at most the number it was made with).
#[derive(Debug, Clone)]
pub struct ServeLog {
    lines: Arc<Mutex<VecDeque<String>>>,
    keep: usize,
}

impl ServeLog {
    fn new(keep: usize) -> Self {
        Self {
            lines: Arc::default(),
            keep: keep.max(1),
        }
    }

    fn push(&self, line: String) {
        if let Ok(mut l) = self.lines.lock() {
            if l.len() == self.keep {
                l.pop_front();
            }
            l.push_back(line);
        }
    }

    /// The kept lines, one per line.
    pub fn text(&self) -> String {
        self.lines
            .lock()
            .map(|l| l.iter().map(|s| format!("{s}\n")).collect())
            .unwrap_or_default()
    }
}

/// A started `joader serve`: the child, the URL it answers at, its log.
#[derive(Debug)]
pub struct ServeChild {
    pub child: Child,
    pub url: String,
    pub log: ServeLog,
}

/// Spawns `cmd` (a `joader serve` command line, its stdout and stderr left to this function)
/// with `env` as its only `AWS_*` variables, and waits up to `deadline` for the address it
/// listens on. Keeps the last `keep_lines` lines of its log. On failure the child is killed
/// and the error carries the log.
pub fn spawn_serve(
    mut cmd: Command,
    env: &[(&str, &str)],
    keep_lines: usize,
    deadline: Duration,
) -> Result<ServeChild> {
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| k.starts_with("AWS_")) {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().context("cannot start joader serve")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let log = ServeLog::new(keep_lines);
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(addr) = listen_address(&line) {
                let _ = tx.send(addr.to_owned());
            }
            lines.push(line);
        }
    });
    match rx.recv_timeout(deadline) {
        Ok(addr) => Ok(ServeChild {
            child,
            url: format!("http://{addr}"),
            log,
        }),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            bail!("joader serve did not start:\n{}", log.text())
        }
    }
}

/// The `HOST:PORT` of a log line's `addr=` field.
fn listen_address(line: &str) -> Option<&str> {
    let rest = &line[line.find("addr=")? + 5..];
    Some(rest.split_whitespace().next().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_is_the_addr_field_up_to_whitespace() {
        let line =
            "2026-11-25T12:00:00Z  INFO server: joader is serving addr=127.0.0.1:40123 instance=x";
        assert_eq!(listen_address(line), Some("127.0.0.1:40123"));
        assert_eq!(listen_address("no address here"), None);
    }

    #[test]
    fn the_log_keeps_its_last_lines() {
        let log = ServeLog::new(2);
        for l in ["a", "b", "c"] {
            log.push(l.into());
        }
        assert_eq!(log.text(), "b\nc\n");
    }
}
