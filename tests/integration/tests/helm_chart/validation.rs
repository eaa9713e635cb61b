//! Values the chart rejects: by values.schema.json, and by the template checks
//! for what the schema cannot express.
use crate::render::render_err;

/// values.schema.json is checked before anything renders, and names the field.
#[test]
fn schema_rejects_bad_values_naming_the_field() {
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "socketLB=yes"], "- socketLB: Invalid type"),
        (
            &["--set", "acceleration=fast"],
            "- acceleration: acceleration must be one of",
        ),
        (
            &["--set", "nodePortRange=30000"],
            "- nodePortRange: Invalid type. Expected: string, given: integer",
        ),
        (
            &["--set-string", "nodePortRange=30000"],
            "- nodePortRange: Does not match pattern",
        ),
        (
            &["--set", "nodePortRange=a-b"],
            "- nodePortRange: Does not match pattern",
        ),
        (
            &["--set", "maps.maxServices=0"],
            "- maps.maxServices: Must be greater than or equal to 1",
        ),
        (
            &["--set", "maps.maxBackends=-5"],
            "- maps.maxBackends: Must be greater than or equal to 1",
        ),
        (
            &["--set", "maps.maxBackends=many"],
            "- maps.maxBackends: Invalid type",
        ),
        (
            &["--set", "metrics.port=70000"],
            "- metrics.port: Must be less than or equal to 65535",
        ),
        (
            &["--set", "healthz.port=0"],
            "- healthz.port: Must be greater than or equal to 1",
        ),
        (
            &["--set", "k8sServicePort=65536"],
            "- k8sServicePort: Must be less than or equal to 65535",
        ),
        (
            &["--set", "metrics.enabled=maybe"],
            "- metrics.enabled: Invalid type",
        ),
        (
            &["--set", "metrics.bindAddress=localhost"],
            "- metrics.bindAddress:",
        ),
        (
            &["--set", "logFormat=xml"],
            "- logFormat: logFormat must be one of",
        ),
        (
            &["--set", "image.pullPolicy=Sometimes"],
            "- image.pullPolicy:",
        ),
        (
            &["--set", "image.digest=sha256:abc"],
            "- image.digest: Does not match pattern",
        ),
        (
            &["--set", "devices[0]=eth0/1"],
            "- devices.0: Does not match pattern",
        ),
        (&["--set", "devices={eth0,eth0}"], "- devices: array items"),
        (
            &["--set", "accelerationDevices[0]=eth0/1"],
            "- accelerationDevices.0: Does not match pattern",
        ),
        (
            &["--set", "snatPortRange=a-b"],
            "- snatPortRange: Does not match pattern",
        ),
        (
            &["--set", "terminatePodUdpSockets=yes"],
            "- terminatePodUdpSockets: Invalid type",
        ),
        (&["--set", "devices=eth0"], "- devices: Invalid type"),
        (&["--set", "extraArgs=--x"], "- extraArgs: Invalid type"),
        // A null deletes the chart's default, as in Helm; the key is required.
        (&["--set", "metrics=null"], "- (root): metrics is required"),
        (
            &["--set", "bogus=1"],
            "- (root): Additional property bogus is not allowed",
        ),
        (
            &["--set", "maps.extra=1"],
            "- maps: Additional property extra is not allowed",
        ),
        (
            &["--set", "image.repository="],
            "- image.repository: String length must be greater than or equal to 1",
        ),
        (
            &["--set", "k8sServiceHost=https://api:6443"],
            "- k8sServiceHost: Does not match pattern",
        ),
    ];
    for (args, want) in cases {
        let e = render_err(args);
        assert!(
            e.contains("values don't meet the specifications of the schema(s)"),
            "{args:?}: not a schema error:\n{e}"
        );
        assert!(e.contains(want), "{args:?}: want {want:?} in:\n{e}");
    }
    // The schema runs before the templates: this would also fail in a template.
    let e = render_err(&["--set", "serviceMonitor.enabled=true,acceleration=off"]);
    assert!(e.contains("- acceleration:"), "{e}");
    assert!(!e.contains("bindAddress"), "{e}");
}

#[test]
fn template_checks_reject_what_the_schema_cannot() {
    let e = render_err(&["--set", "nodePortRange=40000-30000"]);
    assert!(e.contains("nodePortRange \"40000-30000\""), "{e}");
    let e = render_err(&["--set", "nodePortRange=30000-70000"]);
    assert!(e.contains("nodePortRange"), "{e}");
    let e = render_err(&["--set", "snatPortRange=65000-61000"]);
    assert!(e.contains("snatPortRange \"65000-61000\""), "{e}");
    let e = render_err(&["--set", "metrics.port=10256"]);
    assert!(e.contains("metrics.port and healthz.port"), "{e}");
    // Chart.yaml's kubeVersion, as helm checks it.
    let e = render_err(&["--kube-version", "v1.29.3"]);
    assert!(e.contains("incompatible with Kubernetes v1.29.3"), "{e}");
}
