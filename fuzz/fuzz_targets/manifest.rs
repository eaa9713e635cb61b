//! The manifest directory source on one file: YAML (multi-document, `List`)
//! or JSON, through the k8s-to-domain conversion, into store changes.
//! Oracles: reading the same file again changes nothing, removing it
//! withdraws exactly what it defined, and where the lite YAML reader takes
//! the text, serde-saphyr reads the same.
#![no_main]

use std::{collections::BTreeSet, path::PathBuf, sync::OnceLock};

use libfuzzer_sys::fuzz_target;
use weir_agent::{
    source::manifests::{ManifestDir, lite_agrees},
    store::Change,
};

/// One directory per process: the parser only reads files, and libFuzzer runs
/// inputs one at a time. Each input makes and removes it: libFuzzer ends a
/// timed run with `exit`, which drops nothing, so a directory made once
/// per process was left in the temp dir by every run.
fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        std::env::temp_dir().join(format!("weir-fuzz-manifest-{}", std::process::id()))
    })
}

fn ids(changes: &[Change]) -> BTreeSet<String> {
    changes
        .iter()
        .map(|c| match c {
            Change::UpsertService(s) => format!("svc {}", s.id),
            Change::DeleteService(id) => format!("svc {id}"),
            Change::UpsertSlice(s) => format!("slice {}", s.id),
            Change::DeleteSlice(id) => format!("slice {id}"),
            other => panic!("a manifest produced {other:?}"),
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Err(e) = lite_agrees(text)
    {
        panic!("the lite YAML reader and serde-saphyr differ on {text:?}:\n{e}");
    }
    // The extension picks the parser, as in the agent.
    let name = if data.first() == Some(&b'{') {
        "m.json"
    } else {
        "m.yaml"
    };
    std::fs::create_dir_all(dir()).expect("temp dir");
    let path = dir().join(name);
    std::fs::write(&path, data).expect("write manifest");
    let paths = BTreeSet::from([path.clone()]);
    let mut m = ManifestDir::new(dir());
    let first = m.scan_paths(&paths).expect("scan");
    assert!(
        first
            .iter()
            .all(|c| matches!(c, Change::UpsertService(_) | Change::UpsertSlice(_))),
        "a first read can only add: {first:?}"
    );
    let again = m.scan_paths(&paths).expect("rescan");
    assert!(again.is_empty(), "an unchanged file changed {again:?}");
    std::fs::remove_file(&path).expect("remove manifest");
    let gone = m.scan_paths(&paths).expect("scan after removal");
    assert!(
        gone.iter()
            .all(|c| matches!(c, Change::DeleteService(_) | Change::DeleteSlice(_))),
        "a removal can only delete: {gone:?}"
    );
    assert_eq!(ids(&first), ids(&gone), "removal withdrew something else");
    std::fs::remove_dir(dir()).expect("remove the empty temp dir");
});
