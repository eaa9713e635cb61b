//! `weir-kubelet completions bash`, sourced by a real bash and asked what it
//! completes, as a TAB would.
use std::process::Command;

fn bash_completes(script: &std::path::Path, words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let cword = words.len() - 1;
    let body = format!(
        "source {} || exit 1; f=$(complete -p weir-kubelet | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p'); \
         COMP_WORDS=({}); COMP_CWORD={cword}; $f weir-kubelet '{}' '{}'; echo \"${{COMPREPLY[*]}}\"",
        script.display(),
        quoted.join(" "),
        words[cword],
        words[cword - 1],
    );
    let out = Command::new("bash").arg("-c").arg(body).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn bash_completes_flags_and_the_subcommand() {
    let out = Command::new(env!("CARGO_BIN_EXE_weir-kubelet"))
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let dir = std::env::temp_dir().join(format!("weir-kubelet-completion-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("weir-kubelet.bash");
    std::fs::write(&file, &out.stdout).unwrap();
    let got = [
        bash_completes(&file, &["weir-kubelet", "--hostname-o"]),
        bash_completes(&file, &["weir-kubelet", "--root"]),
        bash_completes(&file, &["weir-kubelet", "completions", "z"]),
    ];
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(got, ["--hostname-override", "--root-dir", "zsh"]);
}

/// `--config` is optional, as the kubelet's: without it the defaults
/// apply, and flags are still checked before anything starts.
#[test]
fn without_config_flags_are_checked_first() {
    let out = Command::new(env!("CARGO_BIN_EXE_weir-kubelet"))
        .args(["--container-runtime-endpoint", "tcp://10.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--container-runtime-endpoint: \"tcp://10.0.0.1:1\" is not a unix socket"),
        "{err}"
    );
}
