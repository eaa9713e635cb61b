//! `cargo xtask bench datapath|scale`: build release binaries, run a bench from
//! `weir_integration::bench`, print its Markdown table and write JSON and SVG
//! plots next to it.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use weir_integration::bench::{
    datapath::{self, DatapathOptions},
    record::Record,
    report::{self, Plot},
    scale::{self, ScaleOptions},
};

use crate::util::{prepare_harness, root};

#[derive(clap::Subcommand)]
pub enum Bench {
    /// Weir's socket LB against kube-proxy's iptables and nftables rulesets and
    /// direct connections, 1 to 100,000 Services.
    Datapath {
        /// N up to 10,000 and one repetition: under five minutes on 2 cores.
        #[arg(long)]
        quick: bool,
        /// Write the records as JSON here (default: <out>/datapath.json).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Where the report, JSON and SVG plots go.
        #[arg(long, default_value = "target/bench")]
        out: PathBuf,
    },
    /// Control-plane scale: cold sync, single-change latency and memory at
    /// 100,000 Services × 10 endpoints in standalone mode.
    Scale {
        #[arg(long, default_value_t = 100_000)]
        services: u32,
        #[arg(long, default_value_t = 10)]
        endpoints: u32,
        #[arg(long, default_value_t = 200)]
        changes: u32,
        #[arg(long)]
        json: Option<PathBuf>,
        #[arg(long, default_value = "target/bench")]
        out: PathBuf,
    },
}

pub fn run(bench: Bench) -> Result<()> {
    prepare_harness(true)?;
    let work = std::env::temp_dir().join(format!("weir-test-{}-bench", std::process::id()));
    let result = match bench {
        Bench::Datapath { quick, json, out } => {
            let opts = if quick {
                DatapathOptions::quick()
            } else {
                DatapathOptions::full()
            };
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
            services,
            endpoints,
            changes,
            json,
            out,
        } => {
            let (records, notes) = scale::run(&ScaleOptions {
                services,
                endpoints,
                changes,
            })?;
            publish(
                &out,
                "scale",
                json,
                "Control-plane scale bench",
                &records,
                &notes,
                &[],
            )
        }
    };
    let _ = std::fs::remove_dir_all(&work);
    result
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
    let md = report::markdown(title, records, notes);
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
