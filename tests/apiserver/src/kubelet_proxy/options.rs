//! The query of a proxied subresource, decoded as kube-apiserver's
//! parameter codec decodes it into PodLogOptions, PodExecOptions,
//! PodAttachOptions and PodPortForwardOptions; and the query the kubelet
//! gets (upstream's `LogLocation` and `streamParams`).
use jiff::Timestamp;
use serde_json::json;

use super::Subresource;
use crate::error::ApiError;

/// Every `key=value` of a query, repeats kept in order.
pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(raw: &str) -> Self {
        Query(
            form_urlencoded::parse(raw.as_bytes())
                .into_owned()
                .collect(),
        )
    }

    fn all<'a, 'k>(&'a self, key: &'k str) -> impl Iterator<Item = &'a str> + use<'a, 'k> {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn first(&self, key: &str) -> Option<&str> {
        self.all(key).next()
    }

    fn string(&self, key: &str) -> String {
        self.first(key).unwrap_or_default().to_string()
    }

    /// apimachinery's `Convert_Slice_string_To_bool`: only "0" and "false"
    /// (any case) are false once the key is there, even an empty value is
    /// true.
    fn flag(&self, key: &str) -> bool {
        self.first(key)
            .is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"))
    }

    fn int(&self, key: &str) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.first(key) else {
            return Ok(None);
        };
        v.parse().map(Some).map_err(|e: std::num::ParseIntError| {
            let why = match e.kind() {
                std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
                    "value out of range"
                }
                _ => "invalid syntax",
            };
            ApiError::BadRequest(format!("strconv.ParseInt: parsing {v:?}: {why}"))
        })
    }
}

/// `params` as a query string, keys sorted as Go's `url.Values.Encode`
/// sorts them (repeats keep their order); empty for none.
pub fn encode(params: &[(&'static str, String)]) -> String {
    let mut sorted: Vec<&(&str, String)> = params.iter().collect();
    sorted.sort_by_key(|(k, _)| *k);
    if sorted.is_empty() {
        return String::new();
    }
    let mut out = form_urlencoded::Serializer::for_suffix(String::from("?"), 1);
    for (k, v) in sorted {
        out.append_pair(k, v);
    }
    out.finish()
}

/// PodLogOptions.
#[derive(Debug, Default)]
pub struct LogOptions {
    pub container: String,
    follow: bool,
    previous: bool,
    timestamps: bool,
    since_seconds: Option<i64>,
    since_time: Option<Timestamp>,
    tail_lines: Option<i64>,
    limit_bytes: Option<i64>,
}

impl LogOptions {
    pub fn parse(q: &Query) -> Result<Self, ApiError> {
        let since_time = match q.first("sinceTime") {
            None | Some("") | Some("null") => None,
            Some(t) => Some(t.parse::<Timestamp>().map_err(|e| {
                ApiError::BadRequest(format!(
                    "parsing time {t:?} as \"2006-01-02T15:04:05Z07:00\": {e}"
                ))
            })?),
        };
        Ok(LogOptions {
            container: q.string("container"),
            follow: q.flag("follow"),
            previous: q.flag("previous"),
            timestamps: q.flag("timestamps"),
            since_seconds: q.int("sinceSeconds")?,
            since_time,
            tail_lines: q.int("tailLines")?,
            limit_bytes: q.int("limitBytes")?,
        })
    }

    /// Upstream's `ValidatePodLogOptions`, answered as `NewInvalid` does.
    pub fn validate(&self, pod: &str) -> Result<(), ApiError> {
        // (cause reason, field, what is wrong)
        let mut errs: Vec<(&str, &str, String)> = Vec::new();
        if let Some(n) = self.tail_lines.filter(|n| *n < 0) {
            errs.push((
                "FieldValueInvalid",
                "tailLines",
                format!("Invalid value: {n}: must be greater than or equal to 0"),
            ));
        }
        if let Some(n) = self.limit_bytes.filter(|n| *n < 1) {
            errs.push((
                "FieldValueInvalid",
                "limitBytes",
                format!("Invalid value: {n}: must be greater than 0"),
            ));
        }
        match (self.since_seconds, self.since_time) {
            (Some(_), Some(_)) => errs.push((
                "FieldValueForbidden",
                "",
                "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified".into(),
            )),
            (Some(n), None) if n < 1 => errs.push((
                "FieldValueInvalid",
                "sinceSeconds",
                format!("Invalid value: {n}: must be greater than 0"),
            )),
            _ => {}
        }
        if errs.is_empty() {
            return Ok(());
        }
        let each: Vec<String> = errs.iter().map(|(_, f, m)| format!("{f}: {m}")).collect();
        let all = match each.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let causes: Vec<_> = errs
            .iter()
            .map(|(reason, field, message)| {
                let mut c = json!({"reason": reason, "message": message});
                if !field.is_empty() {
                    c["field"] = json!(field);
                }
                c
            })
            .collect();
        Err(ApiError::Other {
            code: 422,
            reason: "Invalid",
            message: format!("PodLogOptions {pod:?} is invalid: {all}"),
            details: Some(json!({"name": pod, "kind": "PodLogOptions", "causes": causes})),
        })
    }

    /// `/containerLogs` takes the same names; only what is set is sent.
    pub fn kubelet_params(&self) -> Vec<(&'static str, String)> {
        let mut p = Vec::new();
        for (key, on) in [
            ("follow", self.follow),
            ("previous", self.previous),
            ("timestamps", self.timestamps),
        ] {
            if on {
                p.push((key, "true".to_string()));
            }
        }
        if let Some(n) = self.since_seconds {
            p.push(("sinceSeconds", n.to_string()));
        }
        if let Some(t) = self.since_time {
            // RFC 3339 to the second, as Go's time.RFC3339 layout writes it.
            p.push((
                "sinceTime",
                Timestamp::from_second(t.as_second())
                    .unwrap_or(t)
                    .to_string(),
            ));
        }
        if let Some(n) = self.tail_lines {
            p.push(("tailLines", n.to_string()));
        }
        if let Some(n) = self.limit_bytes {
            p.push(("limitBytes", n.to_string()));
        }
        p
    }
}

/// Which streams an exec or attach was created with.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Streams {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// PodExecOptions, PodAttachOptions or PodPortForwardOptions. Nothing is
/// validated here: upstream leaves "at least one stream" and "a command"
/// to the kubelet, whose refusal reaches the client as it sent it.
#[derive(Debug, Default)]
pub struct StreamOptions {
    pub container: String,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
    command: Vec<String>,
    ports: Vec<u16>,
}

impl StreamOptions {
    pub fn parse(sub: Subresource, q: &Query) -> Result<Self, ApiError> {
        if sub == Subresource::PortForward {
            // apimachinery's Convert_Slice_string_To_Slice_int32: each value
            // may itself be a comma-separated list.
            let mut ports = Vec::new();
            for v in q.all("ports").flat_map(|v| v.split(',')) {
                let port = v.parse::<u16>().map_err(|_| {
                    ApiError::BadRequest(format!(
                        "cannot convert to []int32: strconv.ParseUint: parsing {v:?}: invalid syntax"
                    ))
                })?;
                ports.push(port);
            }
            return Ok(StreamOptions {
                ports,
                ..Default::default()
            });
        }
        Ok(StreamOptions {
            container: q.string("container"),
            stdin: q.flag("stdin"),
            stdout: q.flag("stdout"),
            stderr: q.flag("stderr"),
            tty: q.flag("tty"),
            command: if sub == Subresource::Exec {
                q.all("command").map(String::from).collect()
            } else {
                Vec::new()
            },
            ports: Vec::new(),
        })
    }

    /// The streams asked for, as the WebSocket-to-SPDY translation opens
    /// them.
    pub fn streams(&self) -> Streams {
        Streams {
            stdin: self.stdin,
            stdout: self.stdout,
            stderr: self.stderr,
            tty: self.tty,
        }
    }

    /// Upstream's `streamParams`: the kubelet's names for the streams.
    pub fn kubelet_params(&self) -> Vec<(&'static str, String)> {
        let mut p = Vec::new();
        for (key, on) in [
            ("input", self.stdin),
            ("output", self.stdout),
            ("error", self.stderr),
            ("tty", self.tty),
        ] {
            if on {
                p.push((key, "1".to_string()));
            }
        }
        p.extend(self.command.iter().map(|c| ("command", c.clone())));
        if !self.ports.is_empty() {
            let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
            p.push(("port", ports.join(",")));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(raw: &str) -> Query {
        Query::parse(raw)
    }

    #[test]
    fn flags_decode_like_apimachinery() {
        let query = q("a=true&b=1&c=&d=0&e=False&f=yes");
        let got: Vec<bool> = ["a", "b", "c", "d", "e", "f", "g"]
            .iter()
            .map(|k| query.flag(k))
            .collect();
        assert_eq!(got, [true, true, true, false, false, true, false]);
    }

    #[test]
    fn log_options_translate_to_the_kubelets_query_sorted() {
        let opts = LogOptions::parse(&q(
            "container=c&follow=true&tailLines=10&timestamps=1&limitBytes=5&previous=false&sinceTime=2024-05-01T10:00:00.5%2B02:00",
        ))
        .unwrap();
        assert_eq!(opts.container, "c");
        assert_eq!(
            encode(&opts.kubelet_params()),
            "?follow=true&limitBytes=5&sinceTime=2024-05-01T08%3A00%3A00Z&tailLines=10&timestamps=true"
        );
        assert_eq!(encode(&LogOptions::default().kubelet_params()), "");
    }

    #[test]
    fn log_options_are_validated_like_upstream() {
        let bad = LogOptions::parse(&q("tailLines=-1")).unwrap();
        let s = bad.validate("p").unwrap_err().status();
        assert_eq!(
            s["message"],
            "PodLogOptions \"p\" is invalid: tailLines: Invalid value: -1: must be greater than or equal to 0"
        );
        assert_eq!(s["code"], 422);
        assert_eq!(s["details"]["causes"][0]["field"], "tailLines");
        let both = LogOptions::parse(&q(
            "sinceSeconds=0&sinceTime=2024-01-01T00:00:00Z&limitBytes=0",
        ))
        .unwrap();
        assert_eq!(
            both.validate("p").unwrap_err().to_string(),
            "PodLogOptions \"p\" is invalid: [limitBytes: Invalid value: 0: must be greater than 0, : Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified]"
        );
        let zero = LogOptions::parse(&q("sinceSeconds=0")).unwrap();
        assert!(
            zero.validate("p")
                .unwrap_err()
                .to_string()
                .contains("sinceSeconds: Invalid value: 0: must be greater than 0")
        );
        let e = LogOptions::parse(&q("tailLines=ten")).unwrap_err();
        assert_eq!(
            (e.code(), e.to_string()),
            (
                400,
                "strconv.ParseInt: parsing \"ten\": invalid syntax".into()
            )
        );
    }

    #[test]
    fn stream_options_use_the_kubelets_names() {
        let exec = StreamOptions::parse(
            Subresource::Exec,
            &q("command=sh&command=-c&command=echo+hi&stdin=true&stdout=true&tty=true&container=c"),
        )
        .unwrap();
        assert_eq!(
            encode(&exec.kubelet_params()),
            "?command=sh&command=-c&command=echo+hi&input=1&output=1&tty=1"
        );
        let attach =
            StreamOptions::parse(Subresource::Attach, &q("command=x&stderr=1&stdout=0")).unwrap();
        assert_eq!(encode(&attach.kubelet_params()), "?error=1");
        let pf =
            StreamOptions::parse(Subresource::PortForward, &q("ports=80&ports=81,82")).unwrap();
        assert_eq!(encode(&pf.kubelet_params()), "?port=80%2C81%2C82");
        assert_eq!(
            StreamOptions::parse(Subresource::PortForward, &q("ports=http"))
                .unwrap_err()
                .code(),
            400
        );
    }
}
