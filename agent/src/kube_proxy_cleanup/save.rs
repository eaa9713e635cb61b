//! Reading `iptables-save` output: tables, their chains and their rules, with
//! each rule's jump target. Pure, so the kernel-free tests cover every format
//! detail the cleanup depends on.

/// One `*table` … `COMMIT` block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedTable<'a> {
    pub name: &'a str,
    pub chains: Vec<ChainDecl<'a>>,
    pub rules: Vec<Rule<'a>>,
}

/// A `:NAME POLICY [packets:bytes]` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainDecl<'a> {
    pub name: &'a str,
    /// Built-in chains have a policy; user chains print `-` instead.
    pub builtin: bool,
}

/// An `-A CHAIN SPEC` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule<'a> {
    pub chain: &'a str,
    /// Everything after the chain name, exactly as saved: `iptables-restore`
    /// parses it back into the same rule, which is what `-D CHAIN SPEC` needs.
    pub spec: &'a str,
    /// The chain or target after `-j`/`-g`, unquoted.
    pub target: Option<String>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("line {line}: {what} outside a *table … COMMIT block: {text:?}")]
    OutsideTable {
        line: usize,
        what: &'static str,
        text: String,
    },
    #[error("line {line}: *{table} starts before *{open} is committed")]
    Nested {
        line: usize,
        table: String,
        open: String,
    },
    #[error("line {line}: {text:?} is neither a chain, a rule nor COMMIT")]
    Unknown { line: usize, text: String },
    #[error("line {line}: unterminated quote in {text:?}")]
    Unterminated { line: usize, text: String },
    #[error("table *{table} has no COMMIT")]
    Uncommitted { table: String },
}

/// Every table in `text`, in order. Only complete blocks count: a missing
/// `COMMIT` means a truncated dump, and acting on half a table could leave a
/// chain that is still jumped to.
pub fn parse(text: &str) -> Result<Vec<SavedTable<'_>>, ParseError> {
    let mut tables = Vec::new();
    let mut open: Option<SavedTable<'_>> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim_end();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        if let Some(name) = l.strip_prefix('*') {
            if let Some(t) = &open {
                return Err(ParseError::Nested {
                    line,
                    table: name.to_owned(),
                    open: t.name.to_owned(),
                });
            }
            open = Some(SavedTable {
                name,
                ..SavedTable::default()
            });
            continue;
        }
        let outside = |what| ParseError::OutsideTable {
            line,
            what,
            text: l.to_owned(),
        };
        if l == "COMMIT" {
            tables.push(open.take().ok_or_else(|| outside("COMMIT"))?);
        } else if let Some(decl) = l.strip_prefix(':') {
            let t = open.as_mut().ok_or_else(|| outside("a chain"))?;
            let mut parts = decl.split_whitespace();
            let name = parts.next().unwrap_or_default();
            let builtin = parts.next().is_some_and(|p| p != "-");
            t.chains.push(ChainDecl { name, builtin });
        } else if let Some(rest) = strip_counters(l).strip_prefix("-A ") {
            let t = open.as_mut().ok_or_else(|| outside("a rule"))?;
            let (chain, spec) = rest.split_once(' ').unwrap_or((rest, ""));
            let target = target(spec).ok_or_else(|| ParseError::Unterminated {
                line,
                text: l.to_owned(),
            })?;
            t.rules.push(Rule {
                chain,
                spec,
                target,
            });
        } else {
            return Err(ParseError::Unknown {
                line,
                text: l.to_owned(),
            });
        }
    }
    match open {
        Some(t) => Err(ParseError::Uncommitted {
            table: t.name.to_owned(),
        }),
        None => Ok(tables),
    }
}

/// `iptables-save -c` puts `[packets:bytes] ` in front of each rule.
fn strip_counters(l: &str) -> &str {
    if l.starts_with('[')
        && let Some((_, rest)) = l.split_once("] ")
    {
        return rest;
    }
    l
}

/// The jump or goto target of a rule spec; `None` for an unterminated quote.
/// Comments may contain ` -j KUBE-…`, so only unquoted words count.
fn target(spec: &str) -> Option<Option<String>> {
    let words = words(spec)?;
    Some(
        words
            .windows(2)
            .find(|w| matches!(w[0], "-j" | "--jump" | "-g" | "--goto"))
            .map(|w| unquote(w[1])),
    )
}

/// Splits at unquoted spaces, keeping quotes (and backslash escapes inside
/// them, as `iptables-save` writes `"` and `\` in comments) in the words.
fn words(spec: &str) -> Option<Vec<&str>> {
    let mut out = Vec::new();
    let mut start = None;
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in spec.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' if quoted => escaped = true,
            '"' => {
                quoted = !quoted;
                start.get_or_insert(i);
            }
            ' ' | '\t' if !quoted => {
                if let Some(s) = start.take() {
                    out.push(&spec[s..i]);
                }
            }
            _ => {
                start.get_or_insert(i);
            }
        }
    }
    if quoted {
        return None;
    }
    if let Some(s) = start {
        out.push(&spec[s..]);
    }
    Some(out)
}

fn unquote(word: &str) -> String {
    match word.strip_prefix('"').and_then(|w| w.strip_suffix('"')) {
        Some(inner) => inner.replace("\\\"", "\"").replace("\\\\", "\\"),
        None => word.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVED: &str = r#"# Generated by iptables-save v1.8.9 on Mon Nov 30 05:49:32 2026
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [3:180]
:KUBE-SERVICES - [0:0]
:MYCHAIN - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -o eth0 -j MASQUERADE
-A KUBE-SERVICES -m comment --comment "ns/svc:p80 cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A MYCHAIN -g KUBE-SERVICES
COMMIT
# Completed on Mon Nov 30 05:49:32 2026
*filter
:INPUT DROP [0:0]
COMMIT
"#;

    #[test]
    fn reads_tables_chains_rules_and_targets() {
        let t = parse(SAVED).expect("parses");
        assert_eq!(t.len(), 2);
        let nat = &t[0];
        assert_eq!(nat.name, "nat");
        let chains: Vec<_> = nat.chains.iter().map(|c| (c.name, c.builtin)).collect();
        assert_eq!(
            chains,
            [
                ("PREROUTING", true),
                ("POSTROUTING", true),
                ("KUBE-SERVICES", false),
                ("MYCHAIN", false)
            ]
        );
        assert_eq!(nat.rules[0].chain, "PREROUTING");
        assert_eq!(
            nat.rules[0].spec,
            r#"-m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#
        );
        let targets: Vec<_> = nat.rules.iter().map(|r| r.target.as_deref()).collect();
        assert_eq!(
            targets,
            [
                Some("KUBE-SERVICES"),
                Some("MASQUERADE"),
                Some("KUBE-SVC-XPGD46QRK7WJZT7O"),
                Some("KUBE-SERVICES")
            ]
        );
        assert_eq!(t[1].name, "filter");
        assert!(t[1].rules.is_empty());
        assert!(t[1].chains[0].builtin, "a DROP policy is still built-in");
    }

    #[test]
    fn jumps_inside_comments_are_not_targets() {
        let text = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m comment --comment \"say \\\"-j KUBE-SERVICES\\\" \\\\\" -j ACCEPT\n-A INPUT -m comment --comment \"-j KUBE-FORWARD\"\n-A INPUT -s 10.0.0.1/32\nCOMMIT\n";
        let t = parse(text).expect("parses");
        let targets: Vec<_> = t[0].rules.iter().map(|r| r.target.as_deref()).collect();
        assert_eq!(targets, [Some("ACCEPT"), None, None]);
    }

    #[test]
    fn counters_quoted_targets_and_empty_dumps() {
        let text = "*nat\n[5:300] -A OUTPUT -j \"KUBE-SERVICES\"\nCOMMIT\n";
        let t = parse(text).expect("parses");
        assert_eq!(t[0].rules[0].chain, "OUTPUT");
        assert_eq!(t[0].rules[0].target.as_deref(), Some("KUBE-SERVICES"));
        assert_eq!(parse(""), Ok(Vec::new()));
        assert_eq!(
            parse("# Warning: iptables-legacy tables present\n"),
            Ok(Vec::new())
        );
    }

    #[test]
    fn malformed_dumps_are_refused() {
        assert!(matches!(
            parse("-A INPUT -j ACCEPT\n"),
            Err(ParseError::OutsideTable { line: 1, .. })
        ));
        assert!(matches!(
            parse("*nat\n:PREROUTING ACCEPT [0:0]\n"),
            Err(ParseError::Uncommitted { table }) if table == "nat"
        ));
        assert!(matches!(
            parse("*nat\n*filter\nCOMMIT\n"),
            Err(ParseError::Nested { line: 2, .. })
        ));
        assert!(matches!(
            parse("*nat\n-A X -m comment --comment \"open -j Y\nCOMMIT\n"),
            Err(ParseError::Unterminated { line: 2, .. })
        ));
        assert!(matches!(
            parse("*nat\n-I X -j Y\nCOMMIT\n"),
            Err(ParseError::Unknown { line: 2, .. })
        ));
    }
}
