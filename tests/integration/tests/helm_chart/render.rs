//! Building and running the renderer, and splitting its output into documents.
use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use serde_json::Value;

use crate::parse::Rendered;

pub(crate) const NS: &str = "kube-system";
pub(crate) const RELEASE: &str = "weir";

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// Builds the renderer once per test process (the same way `cargo xtask
/// helm-template` does), under a per-process name renamed into place.
pub(crate) fn renderer() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = root();
        let out = root.join("target/helm-render");
        std::fs::create_dir_all(&out).expect("target/helm-render");
        let bin = out.join("weir-helm-render");
        let tmp = out.join(format!(".weir-helm-render.test.{}", std::process::id()));
        let res = Command::new("go")
            .args(["build", "-buildvcs=false", "-trimpath", "-o"])
            .arg(&tmp)
            .arg("./helm/render")
            .current_dir(&root)
            .env("GO111MODULE", "off")
            .env("GOPATH", "/usr/share/gocode")
            .env("GOCACHE", out.join("go-cache"))
            .env("GOFLAGS", "")
            // Pure Go (no C compiler needed), and no user go env file.
            .env("CGO_ENABLED", "0")
            .env("GOENV", "off")
            .output()
            .expect("cannot run `go`: run `cargo xtask setup` (golang-go and the Go libraries)");
        assert!(
            res.status.success(),
            "building helm/render failed (run `cargo xtask setup`):\n{}",
            String::from_utf8_lossy(&res.stderr)
        );
        std::fs::rename(&tmp, &bin).expect("rename renderer");
        bin
    })
}

/// One rendered document.
#[derive(Clone, Debug)]
pub(crate) struct Doc {
    pub(crate) source: String,
    pub(crate) kind: String,
    pub(crate) value: Value,
}

/// Runs the renderer on helm/weir with `args`; `Err` is its stderr.
pub(crate) fn render(args: &[&str]) -> Result<Vec<Doc>, String> {
    let out = Command::new(renderer())
        .arg(root().join("helm/weir"))
        .args(["--release-name", RELEASE, "--namespace", NS])
        .args(args)
        .output()
        .expect("run renderer");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).expect("utf-8 output");
    Ok(split(&text))
}

pub(crate) fn render_ok(args: &[&str]) -> Rendered {
    Rendered(render(args).unwrap_or_else(|e| panic!("render {args:?} failed:\n{e}")))
}

pub(crate) fn render_err(args: &[&str]) -> String {
    match render(args) {
        Ok(docs) => panic!(
            "render {args:?} succeeded with {} documents, expected an error",
            docs.len()
        ),
        Err(e) => e,
    }
}

/// Splits `helm template` output: "---\n# Source: weir/templates/x.yaml\n<doc>\n".
pub(crate) fn split(text: &str) -> Vec<Doc> {
    assert!(
        text.starts_with("---\n"),
        "output starts with ---: {text:.80}"
    );
    let mut docs = Vec::new();
    for chunk in text.split("---\n").skip(1) {
        let (first, body) = chunk.split_once('\n').expect("a Source line");
        let source = first
            .strip_prefix("# Source: ")
            .unwrap_or_else(|| panic!("document without a Source line: {chunk}"))
            .to_owned();
        assert!(
            source.starts_with("weir/templates/"),
            "source {source} outside weir/templates/"
        );
        let value: Value = serde_saphyr::from_str(body)
            .unwrap_or_else(|e| panic!("{source}: not YAML: {e}\n{body}"));
        let kind = value["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{source}: no kind"))
            .to_owned();
        docs.push(Doc {
            source,
            kind,
            value,
        });
    }
    docs
}
