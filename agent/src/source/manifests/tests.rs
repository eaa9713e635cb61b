//! Manifest directory tests on a real temporary directory.
use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::PathBuf,
    sync::atomic::{AtomicUsize, Ordering},
};

use super::*;
use crate::model::{
    EndpointSpec, IpFamily, Protocol, ServiceId, ServicePortSpec, ServiceSpec, SliceId,
    SlicePortSpec, SliceSpec,
};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let dir =
            std::env::temp_dir().join(format!("weir-manifests-{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    /// Writes a new file and renames it over `name`, so the inode changes as
    /// with an editor's atomic save.
    fn write(&self, name: &str, text: &str) {
        let tmp = self.0.join(format!(".tmp-{name}"));
        std::fs::write(&tmp, text).expect("write temp file");
        std::fs::rename(&tmp, self.0.join(name)).expect("rename over");
    }

    fn remove(&self, name: &str) {
        std::fs::remove_file(self.0.join(name)).expect("remove file");
    }

    fn scan(&self, md: &mut ManifestDir) -> Vec<Change> {
        in_order(md.scan().expect("scan"))
    }
}

/// A scan's changes, deletes first and then by kind and name: within one
/// scan they come in the order the files were read, which is the
/// directory's.
fn in_order(mut changes: Vec<Change>) -> Vec<Change> {
    changes.sort_by_key(|c| match c {
        Change::DeleteService(id) => (0, 0, id.to_string()),
        Change::DeleteSlice(id) => (0, 1, id.to_string()),
        Change::UpsertService(s) => (1, 0, s.id.to_string()),
        Change::UpsertSlice(s) => (1, 1, s.id.to_string()),
        Change::Node(_) | Change::NodeAddresses(_) => unreachable!("manifests hold no Node"),
    });
    changes
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn svc_yaml(name: &str, ip: &str, port: i64, proto: &str) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: default
spec:
  clusterIP: \"{ip}\"
  ports:
  - name: http
    port: {port}
    protocol: {proto}
"
    )
}

fn svc(name: &str, ip: [u8; 4], port: u16) -> ServiceSpec {
    ServiceSpec {
        id: ServiceId::new("default", name),
        cluster_ips: vec![IpAddr::from(ip)].into(),
        ports: vec![ServicePortSpec {
            name: "http".into(),
            port,
            proto: Protocol::Tcp,
            node_port: None,
        }]
        .into(),
        ..ServiceSpec::default()
    }
}

fn slice_yaml(name: &str, service: &str, address_type: &str, endpoints: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}
  labels:
    kubernetes.io/service-name: {service}
addressType: {address_type}
ports:
- name: http
  port: 8080
endpoints:
{endpoints}"
    )
}

fn slice(name: &str, service: &str, endpoints: Vec<EndpointSpec>) -> SliceSpec {
    SliceSpec {
        id: SliceId::new("default", name),
        service: ServiceId::new("default", service),
        family: IpFamily::V4,
        ports: vec![SlicePortSpec {
            name: "http".into(),
            port: 8080,
            proto: Protocol::Tcp,
        }]
        .into(),
        endpoints: endpoints.into(),
    }
}

fn ready(addr: [u8; 4]) -> EndpointSpec {
    EndpointSpec::ready(IpAddr::from(addr))
}

const NONE: [Change; 0] = [];

fn del_svc(name: &str) -> Change {
    Change::DeleteService(ServiceId::new("default", name))
}

fn del_slice(name: &str) -> Change {
    Change::DeleteSlice(SliceId::new("default", name))
}

#[test]
fn reads_multi_document_yaml_lists_and_json() {
    let d = TempDir::new("formats");
    let one_ep = "- addresses: [\"10.0.0.1\"]\n";
    d.write(
        "a.yaml",
        &format!(
            "{}---\n{}---\n",
            svc_yaml("a", "10.96.0.1", 80, "TCP"),
            slice_yaml("a-1", "a", "IPv4", one_ep)
        ),
    );
    let items = |s: &str| {
        s.lines()
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n")
            .replacen("    ", "  - ", 1)
    };
    d.write(
        "b.yml",
        &format!(
            "apiVersion: v1\nkind: List\nitems:\n{}\n{}\n",
            items(&svc_yaml("b", "10.96.0.2", 80, "TCP")),
            items(&svc_yaml("c", "10.96.0.3", 80, "TCP"))
        ),
    );
    d.write(
        "d.json",
        r#"{"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "d"},
            "spec": {"clusterIP": "10.96.0.4", "ports": [{"name": "http", "port": 80}]}}"#,
    );
    let mut md = ManifestDir::new(&d.0);
    assert_eq!(
        d.scan(&mut md),
        [
            Change::service(svc("a", [10, 96, 0, 1], 80)),
            Change::service(svc("b", [10, 96, 0, 2], 80)),
            Change::service(svc("c", [10, 96, 0, 3], 80)),
            Change::service(svc("d", [10, 96, 0, 4], 80)),
            Change::slice(slice("a-1", "a", vec![ready([10, 0, 0, 1])])),
        ]
    );
    assert_eq!(d.scan(&mut md), NONE, "nothing changed");
}

#[test]
fn ignores_dotfiles_other_extensions_and_directories() {
    let d = TempDir::new("ignored");
    let s = svc_yaml("x", "10.96.0.1", 80, "TCP");
    for name in [
        ".hidden.yaml",
        "notes.txt",
        "svc.yaml.bak",
        "README",
        "yaml",
    ] {
        d.write(name, &s);
    }
    std::fs::create_dir(d.0.join("sub.yaml")).unwrap();
    let mut md = ManifestDir::new(&d.0);
    assert_eq!(d.scan(&mut md), NONE);
    d.write("real.yaml", &s);
    assert_eq!(
        d.scan(&mut md),
        [Change::service(svc("x", [10, 96, 0, 1], 80))]
    );
}

#[test]
fn removing_a_file_deletes_its_objects() {
    let d = TempDir::new("remove");
    let ep = "- addresses: [\"10.0.0.1\"]\n";
    d.write(
        "a.yaml",
        &format!(
            "{}---\n{}",
            svc_yaml("a", "10.96.0.1", 80, "TCP"),
            slice_yaml("a-1", "a", "IPv4", ep)
        ),
    );
    d.write("b.yaml", &svc_yaml("b", "10.96.0.2", 80, "TCP"));
    let mut md = ManifestDir::new(&d.0);
    assert_eq!(d.scan(&mut md).len(), 3);
    d.remove("a.yaml");
    assert_eq!(d.scan(&mut md), [del_svc("a"), del_slice("a-1")]);
    assert_eq!(d.scan(&mut md), NONE);
}

#[test]
fn the_first_file_in_name_order_wins_and_the_next_takes_over() {
    let d = TempDir::new("dup");
    d.write("1.yaml", &svc_yaml("a", "10.96.0.1", 80, "TCP"));
    d.write("2.yaml", &svc_yaml("a", "10.96.0.1", 81, "TCP"));
    let mut md = ManifestDir::new(&d.0);
    assert_eq!(
        d.scan(&mut md),
        [Change::service(svc("a", [10, 96, 0, 1], 80))]
    );
    d.remove("1.yaml");
    assert_eq!(
        d.scan(&mut md),
        [Change::service(svc("a", [10, 96, 0, 1], 81))]
    );
}

#[test]
fn a_scan_in_chunks_ends_where_one_scan_ends() {
    let d = TempDir::new("chunks");
    let n = SCAN_CHUNK + 50;
    for i in 0..n {
        let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
        d.write(
            &format!("s{i:05}.yaml"),
            &svc_yaml(&format!("s{i}"), &ip, 80, "TCP"),
        );
    }
    // Defined twice, in files that may land in different chunks: the first
    // in name order wins whichever chunk reads it last.
    d.write("0-dup.yaml", &svc_yaml("dup", "10.97.0.1", 80, "TCP"));
    d.write("z-dup.yaml", &svc_yaml("dup", "10.97.0.1", 81, "TCP"));

    let mut chunked = ManifestDir::new(&d.0);
    let mut sent = Vec::new();
    chunked
        .scan_in_chunks(|c| {
            sent.push(c);
            true
        })
        .expect("scan");
    assert!(
        sent.len() >= 2,
        "{} files came in {} chunks",
        n + 2,
        sent.len()
    );
    let last_wins = |changes: Vec<Change>| {
        let mut by_id = BTreeMap::new();
        for c in changes {
            let Change::UpsertService(s) = &c else {
                panic!("a first scan only adds Services: {c:?}")
            };
            by_id.insert(s.id.clone(), c);
        }
        by_id
    };
    let whole = last_wins(d.scan(&mut ManifestDir::new(&d.0)));
    assert_eq!(whole.len(), n + 1);
    assert_eq!(last_wins(sent.into_iter().flatten().collect()), whole);
    // And the state it ends in is the same: nothing left to send.
    assert_eq!(d.scan(&mut chunked), []);
}

#[test]
fn a_file_that_does_not_parse_keeps_its_objects() {
    let d = TempDir::new("unparsable");
    d.write("a.yaml", &svc_yaml("a", "10.96.0.1", 80, "TCP"));
    // YAML in a .json file is not JSON: it never loads.
    d.write("b.json", &svc_yaml("b", "10.96.0.2", 80, "TCP"));
    let mut md = ManifestDir::new(&d.0);
    assert_eq!(
        d.scan(&mut md),
        [Change::service(svc("a", [10, 96, 0, 1], 80))]
    );

    d.write("a.yaml", "kind: [unclosed\n  metadata: {\n");
    assert_eq!(d.scan(&mut md), NONE, "a broken file must not withdraw a");

    // Fixed again: only the real difference shows.
    d.write("a.yaml", &svc_yaml("a", "10.96.0.1", 8080, "TCP"));
    assert_eq!(
        d.scan(&mut md),
        [Change::service(svc("a", [10, 96, 0, 1], 8080))]
    );
    d.write("a.yaml", "{{{ not yaml");
    assert_eq!(d.scan(&mut md), NONE);
    // It was still there all along.
    d.remove("a.yaml");
    assert_eq!(d.scan(&mut md), [del_svc("a")]);
}

#[test]
fn invalid_services_are_rejected_and_the_rest_of_the_file_loads() {
    let d = TempDir::new("invalid");
    let docs = [
        svc_yaml("bad-ip", "10.96.0.999", 80, "TCP"),
        svc_yaml("port-zero", "10.96.0.2", 0, "TCP"),
        svc_yaml("port-big", "10.96.0.3", 70000, "TCP"),
        svc_yaml("bad-proto", "10.96.0.4", 80, "FOO"),
        svc_yaml("good", "10.96.0.5", 80, "TCP"),
        // No name: nothing to key it by.
        svc_yaml("x", "10.96.0.6", 80, "TCP").replace("  name: x\n", ""),
    ];
    d.write("all.yaml", &docs.join("---\n"));
    let mut md = ManifestDir::new(&d.0);
    assert_eq!(
        d.scan(&mut md),
        [Change::service(svc("good", [10, 96, 0, 5], 80))]
    );
}

#[test]
fn an_invalid_update_keeps_the_previous_version() {
    let d = TempDir::new("invalid-update");
    let write = |a_port: i64, b_port: i64| {
        d.write(
            "a.yaml",
            &format!(
                "{}---\n{}",
                svc_yaml("a", "10.96.0.1", a_port, "TCP"),
                svc_yaml("b", "10.96.0.2", b_port, "TCP")
            ),
        );
    };
    write(80, 80);
    let mut md = ManifestDir::new(&d.0);
    assert_eq!(d.scan(&mut md).len(), 2);

    write(0, 81);
    assert_eq!(
        d.scan(&mut md),
        [Change::service(svc("b", [10, 96, 0, 2], 81))],
        "a is invalid now and keeps port 80; b changes"
    );
    // Still invalid on the next edit: still kept.
    write(70000, 82);
    assert_eq!(
        d.scan(&mut md),
        [Change::service(svc("b", [10, 96, 0, 2], 82))]
    );
    write(90, 82);
    assert_eq!(
        d.scan(&mut md),
        [Change::service(svc("a", [10, 96, 0, 1], 90))]
    );
}

#[test]
fn fqdn_slices_are_skipped_and_withdraw_what_they_replace() {
    let d = TempDir::new("fqdn");
    let fqdn = slice_yaml("a-1", "a", "FQDN", "- addresses: [\"db.example.com\"]\n");
    d.write("f.yaml", &fqdn);
    let mut md = ManifestDir::new(&d.0);
    assert_eq!(d.scan(&mut md), NONE);
    d.remove("f.yaml");
    assert_eq!(d.scan(&mut md), NONE, "an ignored slice was never there");

    let ipv4 = slice_yaml("a-1", "a", "IPv4", "- addresses: [\"10.0.0.1\"]\n");
    d.write("s.yaml", &ipv4);
    assert_eq!(
        d.scan(&mut md),
        [Change::slice(slice("a-1", "a", vec![ready([10, 0, 0, 1])]))]
    );
    d.write("s.yaml", &fqdn);
    assert_eq!(d.scan(&mut md), [del_slice("a-1")]);
}

#[test]
fn a_bad_address_costs_only_that_address() {
    let d = TempDir::new("bad-address");
    let eps = "- addresses: [\"10.0.0.1\", \"not-an-ip\"]
- addresses: [\"10.0.0.999\"]
- addresses: [\"10.0.0.3\"]
  conditions: {ready: false, serving: true, terminating: true}
";
    d.write("s.yaml", &slice_yaml("a-1", "a", "IPv4", eps));
    let mut md = ManifestDir::new(&d.0);
    let draining = EndpointSpec {
        addr: IpAddr::from([10, 0, 0, 3]),
        ready: false,
        serving: true,
        terminating: true,
        meta: None,
    };
    assert_eq!(
        d.scan(&mut md),
        [Change::slice(slice(
            "a-1",
            "a",
            vec![ready([10, 0, 0, 1]), draining]
        ))]
    );
}

#[test]
fn temporary_files_do_not_trigger_rescans_but_manifests_do() {
    let dir = PathBuf::from("/m");
    let ev = |name: &str, done| DirEvent::Entry {
        name: name.into(),
        done,
    };
    let mut p = Pending::default();
    // An editor's temp file is no manifest.
    p.add(&dir, ev(".a.yaml.tmp", false));
    p.add(&dir, ev("notes.txt", true));
    assert!(!p.full && p.paths.is_empty() && p.ignored, "{p:?}");

    p.add(&dir, ev("a.yaml", true));
    p.add(&dir, ev("b.yml", true));
    assert!(!p.full, "{p:?}");
    assert_eq!(
        p.paths.iter().collect::<Vec<_>>(),
        [&PathBuf::from("/m/a.yaml"), &PathBuf::from("/m/b.yml")]
    );

    // A ConfigMap volume swapping its data link needs a full look, as do
    // lost events.
    p.add(&dir, ev("..data", true));
    assert!(p.full);
    let mut p = Pending::default();
    p.add(&dir, DirEvent::Rescan);
    assert!(p.full);
}

#[test]
fn the_directory_stamp_tells_a_periodic_check_whether_to_rescan() {
    let dir = TempDir::new("dirstamp");
    dir.write("a.yaml", &svc_yaml("a", "10.96.0.1", 80, "TCP"));
    let mut md = ManifestDir::new(&dir.0);
    assert!(md.dir_changed(), "never scanned");
    dir.scan(&mut md);
    assert!(!md.dir_changed());
    // An in-place write leaves the directory alone: inotify names the file.
    std::fs::write(dir.0.join("a.yaml"), svc_yaml("a", "10.96.0.2", 80, "TCP")).unwrap();
    assert!(!md.dir_changed());
    // A new file, a rename over an existing one, a removal: the directory
    // changes. Reading the files an event named settles it as a full scan
    // does, so the periodic check rests after a rename-based write.
    for step in 0..3 {
        // Past the file system's coarse timestamp tick, so the change shows
        // in the stamp on kernels without fine-grained timestamps.
        std::thread::sleep(Duration::from_millis(20));
        match step {
            0 => dir.write("b.yaml", &svc_yaml("b", "10.96.0.3", 80, "TCP")),
            1 => dir.write("a.yaml", &svc_yaml("a", "10.96.0.4", 80, "TCP")),
            _ => dir.remove("b.yaml"),
        }
        assert!(md.dir_changed(), "step {step}");
        let named = BTreeSet::from([dir.0.join(if step == 1 { "a.yaml" } else { "b.yaml" })]);
        assert!(!md.scan_paths(&named).unwrap().is_empty(), "step {step}");
        assert!(!md.dir_changed(), "step {step}");
    }
    // A writer's temporary file changes the directory too, and names no
    // manifest: restamping on its event keeps the check from scanning
    // everything between the write and its rename.
    std::thread::sleep(Duration::from_millis(20));
    dir.write(".a.yaml.tmp", "partial");
    let mut p = Pending::default();
    p.add(
        &dir.0,
        DirEvent::Entry {
            name: ".a.yaml.tmp".into(),
            done: false,
        },
    );
    assert!(p.ignored && !p.full && p.paths.is_empty(), "{p:?}");
    assert!(md.dir_changed());
    md.restamp();
    assert!(!md.dir_changed());
}

#[test]
fn restamping_never_hides_a_directory_put_in_place_of_the_watched_one() {
    let root = TempDir::new("swap");
    for d in ["one", "two"] {
        std::fs::create_dir(root.0.join(d)).unwrap();
    }
    let link = root.0.join("current");
    std::os::unix::fs::symlink("one", &link).unwrap();
    let mut md = ManifestDir::new(&link);
    assert!(md.scan().unwrap().is_empty());
    // The link swapped atomically, as a ConfigMap volume swaps `..data`.
    std::os::unix::fs::symlink("two", root.0.join("next")).unwrap();
    std::fs::rename(root.0.join("next"), &link).unwrap();
    md.restamp();
    assert!(md.dir_changed(), "only a full scan sees the new directory");
}

#[test]
fn a_generated_file_with_thousands_of_documents_loads() {
    let dir = TempDir::new("big");
    let n = 3_000;
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&svc_yaml(
            &format!("s{i}"),
            &format!("10.96.{}.{}", i / 250, i % 250 + 1),
            80,
            "TCP",
        ));
        text.push_str("---\n");
        let eps = format!("- addresses: [\"10.1.{}.{}\"]\n", i / 250, i % 250 + 1);
        text.push_str(&slice_yaml(
            &format!("s{i}-1"),
            &format!("s{i}"),
            "IPv4",
            &eps,
        ));
        text.push_str("---\n");
    }
    dir.write("all.yaml", &text);
    let mut md = ManifestDir::new(&dir.0);
    let changes = dir.scan(&mut md);
    assert_eq!(
        changes.len(),
        2 * n,
        "6,000 documents, over the parser's default 1,024"
    );
    assert!(md.is_clean());
}

#[test]
fn parser_limits_and_size_are_refused_naming_the_limit() {
    let dir = TempDir::new("limits");
    // An alias bomb: nine levels of ten aliases each.
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let p = i - 1;
        bomb.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    dir.write("bomb.yaml", &bomb);
    let e = read_and_parse(&dir.0.join("bomb.yaml")).expect_err("an alias bomb");
    assert!(matches!(e, ManifestError::Budget { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("refused by the YAML parser's limits"),
        "{e}"
    );

    // Sparse: over the limit without writing it.
    let big = dir.0.join("big.yaml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(parse::MAX_MANIFEST_BYTES + 1)
        .unwrap();
    let e = read_and_parse(&big).expect_err("too large");
    assert!(matches!(e, ManifestError::TooLarge { .. }), "{e}");
    assert!(e.to_string().contains("split it into several files"), "{e}");
}

fn read_and_parse(path: &std::path::Path) -> Result<parse::Parsed, ManifestError> {
    match parse::open(path)? {
        parse::Opened::File(_, text) => parse::parse_file(path, &text?, &parse::Objects::default()),
        parse::Opened::Gone => panic!("{} is there", path.display()),
    }
}

#[test]
fn what_is_not_a_regular_file_when_read_is_gone() {
    // Listed, then removed before it was read; a directory or a FIFO with a
    // manifest's name (a FIFO's open would wait for a writer forever). None
    // is an error that would keep the view from being complete.
    let dir = TempDir::new("gone");
    std::fs::create_dir(dir.0.join("d.yaml")).unwrap();
    let fifo = std::ffi::CString::new(dir.0.join("f.yaml").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    for name in ["d.yaml", "f.yaml", "missing.yaml"] {
        assert!(
            matches!(parse::open(&dir.0.join(name)), Ok(parse::Opened::Gone)),
            "{name}"
        );
    }
    dir.write("a.yaml", &svc_yaml("a", "10.96.0.1", 80, "TCP"));
    let mut md = ManifestDir::new(&dir.0);
    assert_eq!(dir.scan(&mut md).len(), 1);
    assert!(md.is_clean());
    let named = BTreeSet::from(["d.yaml", "f.yaml", "missing.yaml"].map(|n| dir.0.join(n)));
    assert!(md.scan_paths(&named).unwrap().is_empty());
    assert!(md.is_clean());
}

#[test]
fn the_last_event_of_a_write_is_not_debounced() {
    let dir = PathBuf::from("/m");
    let ev = |name: &str, done| DirEvent::Entry {
        name: name.into(),
        done,
    };
    assert!(completes_a_write(&dir, &ev("a.yaml", true)));
    // Not a manifest: a rescan decides.
    assert!(!completes_a_write(&dir, &ev(".a.yaml.tmp", true)));
    // Not the end of a write (created, modified, renamed away).
    assert!(!completes_a_write(&dir, &ev("a.yaml", false)));
    assert!(!completes_a_write(&dir, &DirEvent::Rescan));
}

#[test]
fn the_index_shares_names_and_paths_with_what_it_indexes() {
    // At 100k files, a copy of each name and path per index entry was most
    // of what a manifest agent held beyond the objects themselves.
    let dir = TempDir::new("shared");
    let text = format!(
        "{}---\n{}",
        svc_yaml("a", "10.96.0.1", 80, "TCP"),
        slice_yaml("a-1", "a", "IPv4", "- addresses: [\"10.1.0.1\"]\n")
    );
    dir.write("a.yaml", &text);
    let mut md = ManifestDir::new(&dir.0);
    assert_eq!(dir.scan(&mut md).len(), 2);
    let (path, file) = md.files.iter().next().expect("one file");
    assert_eq!(file.objects.len(), 2);
    let name_of = |r: &ObjRef| match r {
        ObjRef::Service(id) => id.name().as_ptr(),
        ObjRef::EndpointSlice(id) => id.name().as_ptr(),
    };
    for r in file.objects.keys() {
        let own = match file.objects.get(&r) {
            Some(Object::Service(s)) => s.id.name().as_ptr(),
            Some(Object::Slice(s)) => s.id.name().as_ptr(),
            other => panic!("{r}: {other:?}"),
        };
        assert_eq!(name_of(&r), own, "{r}: a copy of the name");
        let (indexed, files) = md.defined_in.get_key_value(&r).expect("indexed");
        assert_eq!(name_of(indexed), own, "{r}: the index copies it");
        assert!(
            Arc::ptr_eq(files.first().unwrap(), path),
            "{r}: a copy of the path"
        );
    }

    // A slice names its Service with the Service's own copy, whether the
    // Service is in the same file or was indexed from another.
    dir.write(
        "b.yaml",
        &slice_yaml("a-2", "a", "IPv4", "- addresses: [\"10.1.0.2\"]\n"),
    );
    assert_eq!(dir.scan(&mut md).len(), 1);
    let service = ObjRef::Service(ServiceId::new("default", "a"));
    let Some((ObjRef::Service(svc), _)) = md.defined_in.get_key_value(&service) else {
        panic!("the Service is indexed");
    };
    let slices: Vec<_> = md
        .files
        .values()
        .flat_map(|f| f.objects.keys().filter_map(|r| f.objects.get(&r)))
        .filter_map(|o| match o {
            Object::Slice(s) => Some(s.service.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(slices.len(), 2);
    assert!(slices.iter().all(|s| s.is_shared_with(svc)));
}

#[test]
fn the_pipeline_folds_in_file_order_and_stops_when_asked() {
    let d = TempDir::new("pipeline");
    let n = 5 * 64 + 7;
    let names: Vec<FileName> = (0..n)
        .map(|i| {
            let name = format!("p{i:04}.yaml");
            let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
            d.write(&name, &svc_yaml(&format!("p{i}"), &ip, 80, "TCP"));
            Arc::from(Path::new(&name))
        })
        .collect();
    let jobs = || {
        names
            .iter()
            .map(|n| (Arc::clone(n), Objects::default()))
            .collect()
    };
    let mut seen = Vec::new();
    let mut chunks = 0;
    pipeline::parse_ahead(&d.0, jobs(), 100, |chunk| {
        chunks += 1;
        for (name, outcome) in chunk {
            assert!(
                matches!(outcome, Outcome::Read { parsed: Ok(ref p), .. } if p.objects.len() == 1),
                "{} did not parse",
                name.display()
            );
            seen.push(name);
        }
        true
    });
    assert_eq!(seen, names, "every file once, in order");
    assert!(chunks >= 2, "{n} files came in {chunks} chunks");

    // Stopped after the first chunk, the workers end and nothing more comes.
    let mut folds = 0;
    pipeline::parse_ahead(&d.0, jobs(), 64, |_| {
        folds += 1;
        false
    });
    assert_eq!(folds, 1);
}
