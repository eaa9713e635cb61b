//! The kubelet's pod conversion: a static pod file (YAML 1.1 or JSON) through
//! `static_pods::load_file` and `PodSpec::from_api`, and the same bytes as an
//! API pod (JSON). Oracle: every identifier of an accepted pod that becomes
//! a path is one safe component (issue 12, item 1).
#![no_main]

use std::{path::PathBuf, sync::OnceLock};

use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;
use weir_kubelet::{pod::PodSpec, safe_path, static_pods};

fn file() -> &'static PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        std::env::temp_dir().join(format!("weir-fuzz-pod-{}.yaml", std::process::id()))
    })
}

fn check(spec: &PodSpec) {
    safe_path::uid(&spec.uid).expect("accepted UID");
    for (what, s) in [("namespace", &spec.namespace), ("name", &spec.name)] {
        safe_path::component(what, s).expect("accepted identifier");
    }
    for c in spec.init_containers.iter().chain(&spec.containers) {
        safe_path::component("container", &c.name).expect("accepted container name");
    }
    for v in &spec.volumes {
        safe_path::component("volume", &v.name).expect("accepted volume name");
    }
}

fuzz_target!(|data: &[u8]| {
    std::fs::write(file(), data).expect("write pod");
    let seen = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
    match static_pods::load_file(file(), "node-a", seen) {
        Ok(p) => {
            if let Ok(spec) = PodSpec::from_api(&p.pod) {
                check(&spec);
            }
        }
        Err(e) => drop(e.to_string()),
    }
    let _ = std::fs::remove_file(file());
    if let Ok(pod) = serde_json::from_slice::<Pod>(data) {
        match PodSpec::from_api(&pod) {
            Ok(spec) => check(&spec),
            Err(e) => drop(e.to_string()),
        }
    }
});
