"""`helm template` and `helm lint` with Helm's own engine, without a helm binary.

No helm binary can be installed where Weir is built, but PyPI's
`helm-python-sdk` (module `helm_python`) is Helm v4's Go SDK built as a shared
library; `cargo xtask setup` installs it into /opt/weir-dev/venv. This script is
the thin CLI around it that helm would be:

    python helm/template.py template CHART [-f FILE]... [--set K=V]...
        [--set-string K=V]... [--set-json K=JSON]... [--set-literal K=V]...
        [--release-name NAME] [-n NS] [--kube-version V] [-a GROUP/VERSION]...
    python helm/template.py lint CHART [-f FILE]... [--set K=V]... [-n NS]
        [--kube-version V] [--strict]

`template` is Helm's client-only dry-run install, the action `helm template`
runs: values coalesced, values.schema.json validated, Chart.yaml's
`kubeVersion` checked, templates rendered, documents sorted by kind in Helm's
install order, NOTES.txt left out; printed as helm prints it
(`---\\n# Source: CHART/templates/X.yaml\\n...`). `lint` prints `helm lint`'s
report and fails when it has errors (warnings too with `--strict`). Errors go to
stderr as helm words them, `Error: ...`, with exit status 1.

Defaults are helm's: release `release-name`, namespace `default`.
"""

import argparse
import json
import sys

import helm_python
from helm_python import _native


def merge_maps(a, b):
    """Helm's loader.MergeMaps: maps merge key by key, anything else replaces."""
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_maps(out[k], v)
        else:
            out[k] = v
    return out


def user_values(args):
    """The values the user gave, merged in the order helm's values.Options does:
    files, then --set-json, --set, --set-string, --set-literal."""
    base = {}
    for path in args.values:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise helm_python.HelmError(f"open {path}: {e.strerror.lower()}") from e
        try:
            base = merge_maps(base, helm_python.values_from_yaml(text) or {})
        except helm_python.HelmError as e:
            raise helm_python.HelmError(f"failed to parse {path}: {e}") from e
    # Helm parses each expression *into* the running map; parsing it alone and
    # merging differs only when an index (`a[1]=x`) lands in a list that an
    # earlier source set, which then is replaced rather than patched.
    parsers = [
        ("set-json", args.set_json, helm_python.parse_set_json),
        ("set", args.set, helm_python.parse_set_string),
        ("set-string", args.set_string, helm_python.parse_set_string_values),
        ("set-literal", args.set_literal, helm_python.parse_set_literal),
    ]
    for flag, exprs, parse in parsers:
        for expr in exprs:
            try:
                base = merge_maps(base, parse(expr))
            except helm_python.HelmError as e:
                raise helm_python.HelmError(f"failed parsing --{flag} data: {e}") from e
    return base


def template(args, values):
    chart = helm_python.Chart.load(args.chart)
    # A hook would be missing from the manifest (helm prints hooks after it,
    # but the SDK's install summary does not return them): refuse, not omit.
    for t in chart.templates:
        if "helm.sh/hook" in t["data"]:
            raise helm_python.HelmError(
                f"{t['name']}: hooks are not supported by helm/template.py"
            )
    opts = {"namespace": args.namespace, "dry_run": "client"}
    if args.kube_version:
        opts["kube_version"] = args.kube_version
    if args.api_versions:
        opts["api_versions"] = args.api_versions
    with helm_python.Config(storage_driver="memory", namespace=args.namespace) as cfg:
        # The same library call as Config.install(), whose Python signature
        # lacks the kube_version and api_versions options the library takes
        # (`helm template --kube-version/--api-versions`).
        release = json.loads(
            _native.call_string(
                "helm_install",
                cfg._raw(),
                cfg._context_arg(None),
                chart._raw(),
                None,
                args.release_name,
                json.dumps(values),
                json.dumps(opts),
            )
        )
    # helm template: fmt.Fprintln(out, strings.TrimSpace(rel.Manifest)).
    sys.stdout.write(release["manifest"].strip() + "\n")
    return 0


SEVERITY = ["UNKNOWN", "INFO", "WARNING", "ERROR"]


def lint(args, values):
    report = helm_python.lint(
        args.chart,
        values,
        strict=args.strict,
        namespace=args.namespace,
        kube_version=args.kube_version,
    )
    out = [f"==> Linting {args.chart}"]
    # As helm lint: errors are also messages, printed alone only without any.
    if not report["messages"]:
        out += [f"Error {e}" for e in report["errors"]]
    for m in report["messages"]:
        out.append(f"[{SEVERITY[m['severity']]}] {m['path']}: {m['error']}")
    sys.stdout.write("\n".join(out) + "\n\n")
    failed = 1 if report["errors"] else 0
    summary = f"{report['total_charts_linted']} chart(s) linted, {failed} chart(s) failed"
    if failed:
        sys.stderr.write(f"Error: {summary}\n")
        return 1
    print(summary)
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["template", "lint"])
    p.add_argument("chart", help="chart directory or .tgz")
    p.add_argument("-f", "--values", action="append", default=[], metavar="FILE")
    for flag in ["set", "set-string", "set-json", "set-literal"]:
        p.add_argument(f"--{flag}", action="append", default=[], metavar="K=V")
    p.add_argument("--release-name", default="release-name")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("--kube-version", help="e.g. v1.30.0 (default: the SDK's client-go version)")
    p.add_argument("-a", "--api-versions", action="append", default=[], metavar="GROUP/VERSION")
    p.add_argument("--strict", action="store_true", help="lint: warnings fail too")
    args = p.parse_args(argv)
    try:
        values = user_values(args)
        return template(args, values) if args.mode == "template" else lint(args, values)
    except helm_python.HelmError as e:
        sys.stderr.write(f"Error: {e}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
