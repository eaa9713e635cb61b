//! Values the chart rejects: by values.schema.json, and by the template checks
//! for what the schema cannot express.
use crate::render::render_err;

/// values.schema.json is checked before anything renders, and names the field
/// as a JSON pointer (Helm v4 validates with santhosh-tekuri/jsonschema).
#[test]
fn schema_rejects_bad_values_naming_the_field() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--set", "socketLB=yes"],
            "- at '/socketLB': got string, want boolean",
        ),
        (
            &["--set", "acceleration=fast"],
            "- at '/acceleration': value must be one of 'disabled', 'native', 'best-effort'",
        ),
        (
            &["--set", "nodePortRange=30000"],
            "- at '/nodePortRange': got number, want string",
        ),
        (
            &["--set-string", "nodePortRange=30000"],
            "- at '/nodePortRange': '30000' does not match pattern",
        ),
        (
            &["--set", "nodePortRange=a-b"],
            "- at '/nodePortRange': 'a-b' does not match pattern",
        ),
        (
            &["--set", "loadBalancer.algorithm=ring-hash"],
            "- at '/loadBalancer/algorithm': value must be one of 'random', 'maglev'",
        ),
        (
            // Not a prime: every node would refuse it at start.
            &["--set", "loadBalancer.maglevTableSize=16383"],
            "- at '/loadBalancer/maglevTableSize': value must be one of 251, 509,",
        ),
        (
            &["--set", "loadBalancer.maxMaglevTables=0"],
            "- at '/loadBalancer/maxMaglevTables': minimum: got 0, want 1",
        ),
        (
            &["--set", "maps.maxServices=0"],
            "- at '/maps/maxServices': minimum: got 0, want 1",
        ),
        (
            &["--set", "maps.maxBackends=-5"],
            "- at '/maps/maxBackends': minimum: got -5, want 1",
        ),
        (
            &["--set", "maps.maxBackends=many"],
            "- at '/maps/maxBackends': got string, want integer",
        ),
        (
            &["--set", "metrics.port=70000"],
            "- at '/metrics/port': maximum: got 70,000, want 65,535",
        ),
        (
            &["--set", "healthz.port=0"],
            "- at '/healthz/port': minimum: got 0, want 1",
        ),
        (
            &["--set", "k8sServicePort=65536"],
            "- at '/k8sServicePort': maximum: got 65,536, want 65,535",
        ),
        (
            &["--set", "metrics.enabled=maybe"],
            "- at '/metrics/enabled': got string, want boolean",
        ),
        (
            &["--set", "metrics.bindAddress=localhost"],
            "- at '/metrics/bindAddress': 'localhost' is not valid ipv4",
        ),
        (
            &["--set", "logFormat=xml"],
            "- at '/logFormat': value must be one of 'text', 'json'",
        ),
        (
            &["--set", "image.pullPolicy=Sometimes"],
            "- at '/image/pullPolicy': value must be one of",
        ),
        (
            &["--set", "image.digest=sha256:abc"],
            "- at '/image/digest': 'sha256:abc' does not match pattern",
        ),
        (
            &["--set", "devices[0]=eth0/1"],
            "- at '/devices/0': 'eth0/1' does not match pattern",
        ),
        (
            &["--set", "devices={}"],
            "- at '/devices/0': '' does not match pattern",
        ),
        (
            &["--set", "devices={eth0,eth0}"],
            "- at '/devices': items at 0 and 1 are equal",
        ),
        (
            &["--set", "accelerationDevices[0]=eth0/1"],
            "- at '/accelerationDevices/0': 'eth0/1' does not match pattern",
        ),
        (
            &["--set", "snatPortRange=a-b"],
            "- at '/snatPortRange': 'a-b' does not match pattern",
        ),
        (
            &["--set", "terminatePodUdpSockets=yes"],
            "- at '/terminatePodUdpSockets': got string, want boolean",
        ),
        (
            &["--set", "devices=eth0"],
            "- at '/devices': got string, want array",
        ),
        (
            &["--set", "extraArgs=--x"],
            "- at '/extraArgs': got string, want array",
        ),
        // A null deletes the chart's default, as in Helm; the key is required.
        (
            &["--set", "metrics=null"],
            "- at '': missing property 'metrics'",
        ),
        (
            &["--set", "bogus=1"],
            "- at '': additional properties 'bogus' not allowed",
        ),
        (
            &["--set", "maps.extra=1"],
            "- at '/maps': additional properties 'extra' not allowed",
        ),
        (
            &["--set", "image.repository="],
            "- at '/image/repository': minLength: got 0, want 1",
        ),
        (
            &["--set", "k8sServiceHost=https://api:6443"],
            "- at '/k8sServiceHost': 'https://api:6443' does not match pattern",
        ),
    ];
    for (args, want) in cases {
        let e = render_err(args);
        assert!(
            e.starts_with(
                "Error: values don't meet the specifications of the schema(s) \
                 in the following chart(s):\nweir:\n"
            ),
            "{args:?}: not a schema error:\n{e}"
        );
        assert!(e.contains(want), "{args:?}: want {want:?} in:\n{e}");
    }
    // The schema runs before the templates: this would also fail in a template.
    let e = render_err(&["--set", "serviceMonitor.enabled=true,acceleration=off"]);
    assert!(e.contains("- at '/acceleration':"), "{e}");
    assert!(!e.contains("bindAddress"), "{e}");
}

#[test]
fn template_checks_reject_what_the_schema_cannot() {
    // Helm's wording for a `fail` in a template, with where it ran.
    let e = render_err(&["--set", "nodePortRange=40000-30000"]);
    assert!(
        e.starts_with("Error: execution error at (weir/templates/daemonset.yaml:"),
        "{e}"
    );
    assert!(e.contains("nodePortRange \"40000-30000\""), "{e}");
    let e = render_err(&["--set", "nodePortRange=30000-70000"]);
    assert!(e.contains("nodePortRange"), "{e}");
    let e = render_err(&["--set", "snatPortRange=65000-61000"]);
    assert!(e.contains("snatPortRange \"65000-61000\""), "{e}");
    let e = render_err(&["--set", "metrics.port=10256"]);
    assert!(e.contains("metrics.port and healthz.port"), "{e}");
    // Chart.yaml's kubeVersion, as helm checks it.
    let e = render_err(&["--kube-version", "v1.29.3"]);
    assert_eq!(
        e.trim_end(),
        "Error: chart requires kubeVersion: >=1.30.0-0 which is incompatible with \
         Kubernetes v1.29.3"
    );
}
