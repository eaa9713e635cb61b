//! A long-running `weir-testclient` (`udp-stream`, `udp-one-socket`) whose
//! outcomes are collected as it prints them, so a test can act on the
//! backend a socket is on while the socket lives.
use std::{
    io::{BufRead as _, BufReader, Read as _},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{packet_topology::clients::Probe, topology::ChildGuard};

pub struct ClientStream {
    child: ChildGuard,
    seen: Arc<Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
}

impl ClientStream {
    /// Starts `cmd`, a `weir-testclient` in a streaming mode with its
    /// arguments, and reads what it prints on stderr: one outcome a line.
    pub fn spawn(mut cmd: Command) -> Result<Self> {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let err = child.stderr.take().context("stderr")?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().expect("not poisoned").push(line);
            }
        });
        Ok(Self {
            child: ChildGuard(child),
            seen,
            reader,
        })
    }

    /// Every outcome so far: a backend's name or `error:<what>`.
    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().expect("not poisoned").clone()
    }

    /// The backend the socket is on: its latest answer, once it has one
    /// (within `timeout`).
    pub fn backend(&self, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.seen();
            if let Some(b) = s.iter().rev().find(|l| !l.starts_with("error:")) {
                return Ok(b.clone());
            }
            if Instant::now() > deadline {
                bail!("no answer within {timeout:?}; seen {s:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the client to end and returns its report.
    pub fn finish(mut self) -> Result<Probe> {
        let mut out = String::new();
        if let Some(mut o) = self.child.0.stdout.take() {
            o.read_to_string(&mut out)?;
        }
        self.child.0.wait()?;
        let _ = self.reader.join();
        serde_json::from_str(out.trim()).with_context(|| format!("weir-testclient printed {out:?}"))
    }
}
