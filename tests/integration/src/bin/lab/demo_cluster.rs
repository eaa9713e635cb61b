//! `cargo xtask demo`: the main job, the whole system on this machine. A
//! two-node [`LocalCluster`] (weir-kubelet on containerd per node,
//! weir-agent installed from the chart), then what users do first with a
//! kube-proxy replacement: a Deployment of 3 behind a Service, a client pod
//! on the other node, `kubectl scale --replicas=5`, and the traffic
//! spreading to the new pods. Everything is torn down at the end, on
//! failure too. The datapath-only demo is `cargo xtask demo-datapath`.
use std::{collections::BTreeMap, time::Instant};

use anyhow::Result;
use serde_json::json;
use weir_integration::cluster::{LocalCluster, Options, SAMPLE_IMAGE, Tally};

pub fn run() -> Result<()> {
    let start = Instant::now();
    let c = LocalCluster::up(&Options::default(), |s| println!("\n==> {s}"))?;
    println!("    cluster up in {:.1} s", start.elapsed().as_secs_f64());
    kubectl(&c, &["get", "nodes", "-o", "wide"])?;
    kubectl(
        &c,
        &["-n", "kube-system", "get", "daemonset,pods", "-o", "wide"],
    )?;

    step(&format!(
        "kubectl create deployment web --image={SAMPLE_IMAGE} --replicas=3, and a Service"
    ));
    let vip = c.deploy_web("web", 3, json!({}), json!({}))?;
    kubectl(
        &c,
        &[
            "get",
            "deployment,pods,service,endpointslices",
            "-o",
            "wide",
        ],
    )?;

    step("A client pod on node-2 requests the ClusterIP every 100 ms");
    c.start_client("client", "node-2", &format!("http://{vip}/"))?;
    c.wait_all_answer("client", "web")?;
    show_spread(&c.tally("client")?);

    step("kubectl scale deployment web --replicas=5");
    let before = c.tally("client")?;
    let (first, _) = c.scale_until_served("web", 5, "client")?;
    for (pod, after) in &first {
        println!(
            "    {pod} first answered {:.2} s after the scale",
            after.as_secs_f64()
        );
    }
    // A few more seconds of requests, so the spread is worth showing.
    std::thread::sleep(std::time::Duration::from_secs(4));
    kubectl(&c, &["get", "pods", "-o", "wide"])?;
    show_spread(&c.tally("client")?.since(&before));

    step("What the agent on node-2 programmed (weir-agent inspect services)");
    let node = c.node("node-2")?;
    for line in node.inspect_services(&c.host_dir())?.lines().take(20) {
        println!("    {line}");
    }
    step("Tearing the cluster down");
    drop(c);
    println!("    done in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

fn step(s: &str) {
    println!("\n==> {s}");
}

fn kubectl(c: &LocalCluster, args: &[&str]) -> Result<()> {
    println!("    $ kubectl {}", args.join(" "));
    for line in c.kubectl_ok(args)?.lines() {
        println!("    {line}");
    }
    Ok(())
}

fn show_spread(t: &Tally) {
    let total: u32 = t.ok.values().sum();
    let by: BTreeMap<_, _> = t.ok.iter().collect();
    println!("    {} requests, {} failed:", t.attempts(), t.failed);
    for (pod, n) in by {
        println!(
            "    {pod:<28} {n:>5}  {:>5.1}%",
            f64::from(*n) * 100.0 / f64::from(total.max(1))
        );
    }
}
