use serde_json::{Value, json};

use super::{super::fast, *};

/// The lite reader takes `text` and reads what serde-saphyr reads.
#[track_caller]
fn agrees(text: &str) {
    let lite = fast::lite_yaml(text).unwrap_or_else(|| {
        panic!(
            "the lite reader gave up ({:?}) on\n{text}",
            documents::<Value>(text).err()
        )
    });
    let full = fast::saphyr_yaml(text, serde_saphyr::Options::default())
        .unwrap_or_else(|| panic!("serde-saphyr refused\n{text}"));
    assert_eq!(fast::seen(lite), fast::seen(full), "\n{text}");
}

/// The lite reader leaves `text` to serde-saphyr.
#[track_caller]
fn gives_up(text: &str) {
    assert!(fast::lite_yaml(text).is_none(), "lite read\n{text}");
}

/// What the scale bench writes, one Service and its slice per file.
const BENCH: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: svc-7
  namespace: ns-7
spec:
  clusterIP: 10.96.0.7
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-7-1
  namespace: ns-7
  labels:
    kubernetes.io/service-name: svc-7
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: ["10.1.0.1"]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: node-1
  targetRef: {kind: Pod, namespace: ns-7, name: svc-7-0a010001, uid: 00000000-0000-4000-8000-00000a010001}
- addresses: ["10.1.0.2"]
  conditions: {ready: false, serving: true, terminating: true}
  nodeName: node-2
"#;

/// As `kubectl get -o yaml` writes a List: block style, quoted timestamps,
/// sequences in their key's column.
const KUBECTL: &str = r#"apiVersion: v1
items:
- apiVersion: v1
  kind: Service
  metadata:
    annotations:
      kubectl.kubernetes.io/last-applied-configuration: |2-
        {"x": 1}
    creationTimestamp: "2026-01-02T03:04:05Z"
    labels:
      app.kubernetes.io/name: web
    name: web
    namespace: shop
    resourceVersion: "1234"
    uid: 5f0c7a1e-0000-4000-8000-000000000001
  spec:
    clusterIP: 10.96.0.10
    clusterIPs:
    - 10.96.0.10
    internalTrafficPolicy: Cluster
    ipFamilies:
    - IPv4
    ipFamilyPolicy: SingleStack
    ports:
    - name: http
      nodePort: 30080
      port: 80
      protocol: TCP
      targetPort: http
    selector:
      app: web
    sessionAffinity: ClientIP
    sessionAffinityConfig:
      clientIP:
        timeoutSeconds: 10800
    type: NodePort
  status:
    loadBalancer: {}
kind: List
metadata:
  resourceVersion: ""
"#;

#[test]
fn reads_what_tools_write_as_serde_saphyr_does() {
    agrees(BENCH);
    // The block scalar in the annotation is beyond the lite reader.
    gives_up(KUBECTL);
    let without_block_scalar = KUBECTL.replace(
        "      kubectl.kubernetes.io/last-applied-configuration: |2-\n        {\"x\": 1}\n",
        "      kubectl.kubernetes.io/last-applied-configuration: '{\"x\": 1}'\n",
    );
    agrees(&without_block_scalar);
    // helm template: comments everywhere, an empty document, indented
    // sequences, quoted and escaped text.
    agrees(
        r#"---
# Source: web/templates/service.yaml
apiVersion: v1   # the core group
kind: Service
metadata:
  name: "web-svc"
  namespace: 'shop'
  labels:
    helm.sh/chart: "web-1.2.3"
    note: "tab\there, quote \" and \\ and \u00e9"
    it: 'it''s'
    "quoted key": x
spec:

  type: ClusterIP
  ports:
    - port: 53
      protocol: UDP
      name: dns
    - port: 8443   # a comment
      targetPort: 8443
      protocol: TCP
  selector:
    app: web
---
---
# Source: web/templates/slice.yaml
{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "web-1", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web-svc"}}, "addressType": "IPv4", "ports": [{"port": 53, "protocol": "UDP", "name": "dns"}], "endpoints": [{"addresses": ["10.1.0.9"], "conditions": {"ready": true}}]}
"#,
    );
    // Nulls, empty collections, a trailing comma, no final newline.
    agrees(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: n\n  labels: {}\n  annotations:\nspec:\n  ports: [{port: 1, name: ~,}]\n  selector: null\nstatus: {loadBalancer: {ingress: [{ip: 192.0.2.1}, ]}}",
    );
}

#[test]
fn leaves_what_it_does_not_read_to_serde_saphyr() {
    let base = "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n";
    for extra in [
        // Anchors, aliases, tags, block scalars, explicit keys.
        "  labels: &l {a: b}\n",
        "  labels: *l\n",
        "  labels: !!map {a: b}\n",
        "  labels:\n    a: |\n      b\n",
        "  labels:\n    ? a\n    : b\n",
        // Scalars over several lines, plain or quoted; flow over lines.
        "  labels:\n    a: b\n      c\n",
        "  labels:\n    a: \"b\n      c\"\n",
        "  labels: {a: b,\n    c: d}\n",
        // Tabs, \r, non-ASCII.
        "  labels:\n\ta: b\n",
        "  labels: {a: b}\r\n",
        "  labels: {a: \"é\"}\n",
        // A duplicate key, in block and in flow.
        "  name: b\n",
        "  labels: {a: b, a: c}\n",
        // A value against the `:` of a plain flow key (YAML's error), and
        // the key `a :b` with no value (YAML's null).
        "  labels: {a :[b]}\n",
        "  labels: {a :b}\n",
        // Plain scalars YAML may read as other types.
        "  x: 1e999\n",
        "  x: [-.Inf]\n",
        "  generation: 0x10\n",
        "  generation: 007\n",
        "  generation: +5\n",
        "  generation: 1_000\n",
        "  generation: '5'\n",
        "  deletionGracePeriodSeconds: 1e3\n",
        "  x: .inf\n",
        // Typed by YAML's rules where the type is open (IntOrString).
        "spec:\n  ports: [{port: 1, targetPort: yes}]\n",
        "spec:\n  ports: [{port: 1, targetPort: 0x10}]\n",
        // A mapping inside a value, an escape YAML has but JSON lacks.
        "  x: a: b\n",
        "  x: \"\\e\"\n",
        // Document end and directives.
        "...\n",
        "%YAML 1.2\n",
    ] {
        let text = format!("{base}{extra}");
        gives_up(&text);
        // And the whole path still reads what serde-saphyr reads.
        let full = fast::saphyr_yaml(&text, serde_saphyr::Options::default());
        let both = fast::yaml(&text, serde_saphyr::Options::default());
        assert_eq!(both.map(fast::seen), full.map(fast::seen), "{text}");
    }
}

#[test]
fn ignored_fields_are_checked_as_serde_saphyr_checks_them() {
    let base = "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n";
    for extra in [
        "  x: yes\n",
        "  x: 1.5\n",
        "  x: True\n",
        "  x: 0x1g\n",
        "  x: 10.96.0.1\n",
        "  x: {y: [00000000-0000-4000-8000-00000a010001, 99999999999999999999999]}\n",
    ] {
        agrees(&format!("{base}{extra}"));
    }
}

#[test]
fn reads_block_flow_and_same_column_sequences() {
    let docs = documents::<Value>(
        "a:\n- 1\n- b: [x, 'y', '1']\n  c:\nd: {e: f, \"g\": [], h: {}}\n---\n# only a comment\n---\ng: h\n",
    )
    .unwrap();
    assert_eq!(
        docs,
        vec![
            json!({"a": [1, {"b": ["x", "y", "1"], "c": null}], "d": {"e": "f", "g": [], "h": {}}}),
            json!({"g": "h"}),
        ]
    );
}

/// Values nobody reads are read all the same, and checked.
#[test]
fn ignored_values_are_read_to_their_end() {
    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Only {
        b: String,
    }
    let only = |text| documents::<Only>(text).map(|mut d| d.remove(0));
    let want = Only { b: "x".into() };
    assert_eq!(
        only("a:\n  - [1, {c: d}]\n  - e: {80: f}\nb: x\n"),
        Ok(want)
    );
    assert_eq!(
        only("a: {c: d, c: e}\nb: x\n").unwrap_err(),
        GiveUp::Unsupported(Unsupported {
            what: "a duplicate key",
            at: 13
        })
    );
    assert!(only("a: [.inf]\nb: x\n").is_err());
}

/// A mapping of many keys still finds the one written twice.
#[test]
fn finds_a_duplicate_among_many_keys() {
    let keys: String = (0..100).map(|i| format!("  k{i}: v\n")).collect();
    let text = format!("a:\n{keys}  k7: again\n");
    assert!(matches!(
        documents::<Value>(&text),
        Err(GiveUp::Unsupported(Unsupported {
            what: "a duplicate key",
            ..
        }))
    ));
    assert!(documents::<Value>(&format!("a:\n{keys}")).is_ok());
}

#[test]
fn says_where_it_gave_up() {
    let unsupported = |text: &str| match documents::<Value>(text) {
        Err(GiveUp::Unsupported(u)) => u,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        unsupported("a: 1\nb: &x 2\n"),
        Unsupported {
            what: "an anchor, alias, tag, block scalar or other indicator",
            at: 8
        }
    );
    assert_eq!(unsupported("a: 1\na: 2\n").what, "a duplicate key");
    let deep = format!("a: {}{}\n", "[".repeat(100), "]".repeat(100));
    assert_eq!(unsupported(&deep).what, "deep nesting");
}
