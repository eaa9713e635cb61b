//! Progress on stderr for the steps of the benches that take minutes: a
//! line per phase with a spinner (or a count) and the time so far, left on
//! screen with its duration when the phase ends.
//!
//! indicatif draws nothing when stderr is not a terminal, so CI logs and
//! redirected runs see only the report.
use std::{borrow::Cow, time::Duration};

use indicatif::{ProgressBar, ProgressStyle};

/// One phase; ends when dropped, also on an early return.
pub struct Phase(ProgressBar);

impl Phase {
    /// A phase without a count.
    pub fn start(msg: impl Into<Cow<'static, str>>) -> Self {
        Self::styled(
            ProgressBar::new_spinner(),
            "{spinner} {msg} ({elapsed})",
            msg,
        )
    }

    /// A phase of `total` steps, each ended by [`Self::inc`].
    pub fn counted(msg: impl Into<Cow<'static, str>>, total: u64) -> Self {
        Self::styled(
            ProgressBar::new(total),
            "{spinner} {msg} {human_pos}/{human_len} ({elapsed})",
            msg,
        )
    }

    fn styled(pb: ProgressBar, template: &str, msg: impl Into<Cow<'static, str>>) -> Self {
        if let Ok(style) = ProgressStyle::with_template(template) {
            pb.set_style(style);
        }
        pb.set_message(msg);
        pb.enable_steady_tick(Duration::from_millis(200));
        Self(pb)
    }

    pub fn inc(&self) {
        self.0.inc(1);
    }

    pub fn is_hidden(&self) -> bool {
        self.0.is_hidden()
    }
}

impl Drop for Phase {
    fn drop(&mut self) {
        if let Ok(style) = ProgressStyle::with_template("✓ {msg} ({elapsed})") {
            self.0.set_style(style);
        }
        self.0.finish();
    }
}

#[cfg(test)]
mod tests {
    use std::io::IsTerminal as _;

    use super::*;

    #[test]
    fn nothing_is_drawn_when_stderr_is_not_a_terminal() {
        // The test harness captures stderr through a pipe; under a terminal
        // (`--nocapture` by hand) there is nothing to check.
        if std::io::stderr().is_terminal() {
            return;
        }
        let p = Phase::counted("changes", 3);
        p.inc();
        assert!(p.is_hidden());
        assert!(Phase::start("sync").is_hidden());
    }
}
