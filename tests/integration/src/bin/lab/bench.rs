//! `cargo xtask bench datapath|scale|kubelet`: build release binaries, run a bench from
//! `weir_integration::bench`, print its Markdown table and write JSON and SVG
//! plots next to it.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use weir_integration::bench::{
    datapath::{self, DatapathOptions},
    kubelet::{self, KubeletOptions},
    record::Record,
    report::{self, Plot},
    scale::{self, ScaleOptions},
};

use crate::root;

#[derive(clap::Subcommand)]
pub enum Bench {
    /// Weir's socket LB and per-packet TC datapath against kube-proxy's
    /// iptables and nftables rulesets and direct connections, 1 to 100,000
    /// Services.
    Datapath {
        /// N up to 10,000, three repetitions: about 16 minutes on 2 cores.
        #[arg(long)]
        quick: bool,
        /// These Service counts instead of the mode's (e.g. 100000).
        #[arg(long, value_delimiter = ',')]
        services: Vec<u32>,
        /// Only these contenders (e.g. direct,weir-socket); all by default.
        #[arg(long, value_delimiter = ',')]
        contenders: Vec<String>,
        /// Write the records as JSON here (default: <out>/datapath.json).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Where the report, JSON and SVG plots go.
        #[arg(long, default_value = "target/bench")]
        out: PathBuf,
    },
    /// Control-plane scale: cold sync, single-change latency and memory at
    /// 100,000 Services × 10 endpoints, from manifest files and from the
    /// test API server.
    Scale {
        /// Where the agent reads the Services from; each is a run of its own.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "manifests,api,api-streaming"
        )]
        source: Vec<scale::Source>,
        #[arg(long, default_value_t = 100_000)]
        services: u32,
        #[arg(long, default_value_t = 10)]
        endpoints: u32,
        #[arg(long, default_value_t = 200)]
        changes: u32,
        /// EndpointSlice updates written within one second after the single
        /// changes, to show how changes coalesce (0 skips it).
        #[arg(long, default_value_t = 1000)]
        burst: u32,
        /// Seconds the idle agent is watched after the sync (≥ 60 shows a
        /// periodic cost such as a rescan).
        #[arg(long, default_value_t = 60)]
        idle_secs: u64,
        /// Seconds the conntrack collector is watched at full tables (a
        /// sweep every 5 s).
        #[arg(long, default_value_t = 30)]
        gc_secs: u64,
        /// Cold starts per source, each on fresh pins; the cold sync is
        /// their median (one start when WEIR_SCALE_PERF profiles).
        #[arg(long, default_value_t = 5)]
        cold_starts: u32,
        #[arg(long)]
        json: Option<PathBuf>,
        #[arg(long, default_value = "target/bench")]
        out: PathBuf,
    },
    /// weir-kubelet on a private containerd with local images: pod start
    /// latency, a burst of pods to all Running, CPU and RSS while idle.
    Kubelet {
        /// Pods started one at a time for the latency percentiles.
        #[arg(long, default_value_t = 20)]
        sequential: u32,
        /// Pods written at once.
        #[arg(long, default_value_t = 100)]
        burst: u32,
        /// Seconds of idle CPU sampling with the burst's pods running.
        #[arg(long, default_value_t = 20)]
        idle_secs: u64,
        #[arg(long)]
        json: Option<PathBuf>,
        #[arg(long, default_value = "target/bench")]
        out: PathBuf,
    },
}

pub fn run(bench: Bench) -> Result<()> {
    let work = std::env::temp_dir().join(format!("weir-test-{}-bench", std::process::id()));
    let result = match bench {
        Bench::Datapath {
            quick,
            services,
            contenders,
            json,
            out,
        } => {
            let mut opts = if quick {
                DatapathOptions::quick()
            } else {
                DatapathOptions::full()
            }
            .only(contenders)?;
            if !services.is_empty() {
                opts.services = services;
            }
            let (records, notes) = datapath::run(&opts, &work)?;
            let title = if quick {
                "Datapath bench (quick)"
            } else {
                "Datapath bench"
            };
            publish(
                &out,
                "datapath",
                json,
                title,
                &records,
                &notes,
                datapath::PLOTS,
            )
        }
        Bench::Scale {
            source,
            services,
            endpoints,
            changes,
            burst,
            idle_secs,
            gc_secs,
            cold_starts,
            json,
            out,
        } => {
            let (records, notes) = scale::run(&ScaleOptions {
                sources: source,
                services,
                endpoints,
                changes,
                burst,
                idle: std::time::Duration::from_secs(idle_secs),
                gc_window: std::time::Duration::from_secs(gc_secs),
                cold_starts,
            })?;
            publish(
                &out,
                "scale",
                json,
                "Control-plane scale bench",
                &records,
                &notes,
                &[],
            )?;
            // The targets after the tables, in the same file.
            let md = absolute(&out).join("scale.md");
            let mut text = std::fs::read_to_string(&md)?;
            let targets = scale::targets::markdown(&records);
            print!("{targets}");
            text.push_str(&targets);
            std::fs::write(&md, text)?;
            Ok(())
        }
        Bench::Kubelet {
            sequential,
            burst,
            idle_secs,
            json,
            out,
        } => {
            let (records, notes) = kubelet::run(&KubeletOptions {
                sequential,
                burst,
                idle: std::time::Duration::from_secs(idle_secs),
            })?;
            // Its own table: the per-metric N × M tables fit Services, not pods.
            let out = absolute(&out);
            std::fs::create_dir_all(&out)?;
            let md = kubelet::markdown(&records, &notes);
            print!("{md}");
            std::fs::write(out.join("kubelet.md"), &md)?;
            let json = json.unwrap_or_else(|| out.join("kubelet.json"));
            report::write_json(&json, &records)
                .with_context(|| format!("writing {}", json.display()))?;
            eprintln!("wrote {}", json.display());
            Ok(())
        }
    };
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn absolute(out: &Path) -> PathBuf {
    if out.is_absolute() {
        out.to_path_buf()
    } else {
        root().join(out)
    }
}

fn publish(
    out: &Path,
    name: &str,
    json: Option<PathBuf>,
    title: &str,
    records: &[Record],
    notes: &[String],
    plots: &[Plot],
) -> Result<()> {
    let out = if out.is_absolute() {
        out.to_path_buf()
    } else {
        root().join(out)
    };
    std::fs::create_dir_all(&out)?;
    let mut md = report::markdown(title, records, notes);
    // A hand-written section kept beside the output (`scale-profile.md`):
    // what a profile says cannot come out of the run itself.
    if let Ok(extra) = std::fs::read_to_string(out.join(format!("{name}-profile.md"))) {
        md.push('\n');
        md.push_str(&extra);
    }
    print!("{md}");
    std::fs::write(out.join(format!("{name}.md")), &md)?;
    let json = json.unwrap_or_else(|| out.join(format!("{name}.json")));
    report::write_json(&json, records).with_context(|| format!("writing {}", json.display()))?;
    let svgs = report::write_svgs(&out, records, plots)?;
    eprintln!(
        "wrote {} and {} plot(s) in {}",
        json.display(),
        svgs.len(),
        out.display()
    );
    Ok(())
}
