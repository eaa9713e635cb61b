//! The `process_*` metrics every Prometheus client library exports (Go's
//! `collectors.NewProcessCollector`, which kube-proxy serves): dashboards
//! and alerts on kube-proxy's memory and CPU keep working on the agent.
//!
//! Read from `/proc/self` at each scrape, so nothing runs between scrapes.
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

#[derive(Debug, Default)]
pub struct ProcessCollector;

/// One reading of `/proc/self`, in the units the metrics use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub cpu_seconds: f64,
    pub resident_bytes: f64,
    pub virtual_bytes: f64,
    pub start_time_seconds: f64,
    pub open_fds: f64,
    /// `None` when the soft limit is unlimited (Go reports nothing then
    /// either).
    pub max_fds: Option<f64>,
    pub threads: f64,
}

impl Sample {
    pub fn read() -> procfs::ProcResult<Self> {
        use procfs::WithCurrentSystemInfo as _;
        let me = procfs::process::Process::myself()?;
        let stat = me.stat()?;
        let ticks = procfs::ticks_per_second() as f64;
        let boot = procfs::boot_time_secs()? as f64;
        let max_fds = match me.limits()?.max_open_files.soft_limit {
            procfs::process::LimitValue::Value(n) => Some(n as f64),
            procfs::process::LimitValue::Unlimited => None,
        };
        // Count of /proc/self/fd entries; a failure (no permission to list
        // it, say) reports 0 rather than dropping the whole family.
        let open_fds = me.fd_count().unwrap_or(0) as f64;
        Ok(Self {
            cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
            resident_bytes: stat.rss_bytes().get() as f64,
            virtual_bytes: stat.vsize as f64,
            start_time_seconds: boot + stat.starttime as f64 / ticks,
            open_fds,
            max_fds,
            threads: stat.num_threads as f64,
        })
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // A /proc that cannot be read leaves the families out of this
        // scrape; the rest of the exposition still goes out.
        let Ok(s) = Sample::read() else {
            return Ok(());
        };
        let counter = ConstCounter::new(s.cpu_seconds);
        counter.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            counter.metric_type(),
        )?)?;
        let mut gauge = |name: &str, help: &str, v: f64| -> Result<(), std::fmt::Error> {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
        };
        gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            s.resident_bytes,
        )?;
        gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            s.virtual_bytes,
        )?;
        gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            s.start_time_seconds,
        )?;
        gauge(
            "process_open_fds",
            "Number of open file descriptors.",
            s.open_fds,
        )?;
        if let Some(max) = s.max_fds {
            gauge(
                "process_max_fds",
                "Maximum number of open file descriptors.",
                max,
            )?;
        }
        gauge("process_threads", "Number of OS threads.", s.threads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let s = Sample::read().unwrap();
        assert!(s.resident_bytes > 1e6, "{s:?}");
        assert!(s.virtual_bytes >= s.resident_bytes, "{s:?}");
        assert!(s.open_fds >= 3.0, "{s:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Started within the last day, and not in the future (boot time
        // and ticks are whole seconds and 1/100 s).
        assert!(s.start_time_seconds <= now + 2.0, "{s:?} vs {now}");
        assert!(s.start_time_seconds > now - 86_400.0, "{s:?} vs {now}");
        // Burn a little CPU so the counter is visibly above zero.
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        assert!(Sample::read().unwrap().cpu_seconds > 0.0);
    }
}
