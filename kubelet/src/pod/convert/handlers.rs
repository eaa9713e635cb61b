//! Probes and lifecycle hooks, their ports resolved against the container's.
use std::time::Duration;

use k8s_openapi::{api::core::v1 as api, apimachinery::pkg::util::intstr::IntOrString};

use super::{Errs, port_number, seconds};
use crate::pod::{
    ContainerPort, Handler, HttpGet, Probe, ProbeAction, Scheme, SpecError,
    probe::ProbeKind as Kind,
};

/// A probe or hook port: a number, or the name of one of the container's
/// ports (pkg/kubelet/prober `extractPort`: a name that matches no port is
/// tried as a number before giving up).
fn resolve_port(
    errs: &mut Errs,
    field: String,
    port: &IntOrString,
    ports: &[ContainerPort],
) -> Option<u16> {
    match port {
        IntOrString::Int(n) => port_number(errs, field, i64::from(*n)),
        IntOrString::String(name) => {
            if let Some(p) = ports.iter().find(|p| p.name.as_deref() == Some(name)) {
                return Some(p.container_port);
            }
            match name.parse::<i64>() {
                Ok(n) => port_number(errs, field, n),
                Err(_) => {
                    errs.0.push(SpecError::PortNotFound {
                        field,
                        name: name.clone(),
                    });
                    None
                }
            }
        }
    }
}

fn convert_http_get(
    errs: &mut Errs,
    h: &api::HTTPGetAction,
    at: &str,
    ports: &[ContainerPort],
) -> Option<HttpGet> {
    let scheme = match h.scheme.as_deref() {
        None | Some("HTTP") => Scheme::Http,
        Some("HTTPS") => Scheme::Https,
        Some(v) => {
            errs.invalid(format!("{at}.scheme"), v, "must be HTTP or HTTPS");
            Scheme::Http
        }
    };
    let port = resolve_port(errs, format!("{at}.port"), &h.port, ports)?;
    let path = h
        .path
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/".to_owned());
    let path = if path.starts_with('/') {
        path
    } else {
        format!("/{path}")
    };
    Some(HttpGet {
        scheme,
        host: h.host.clone().filter(|h| !h.is_empty()),
        port,
        path,
        headers: h
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect(),
    })
}

pub(super) fn convert_probe(
    errs: &mut Errs,
    p: &api::Probe,
    at: &str,
    kind: Kind,
    ports: &[ContainerPort],
) -> Option<Probe> {
    let handlers = [
        p.exec.is_some(),
        p.http_get.is_some(),
        p.tcp_socket.is_some(),
        p.grpc.is_some(),
    ];
    let count = handlers.iter().filter(|h| **h).count();
    if count != 1 {
        errs.invalid(
            at,
            count,
            "must have exactly one handler (exec, httpGet, tcpSocket, grpc)",
        );
        return None;
    }
    let action = if let Some(e) = &p.exec {
        let command = e.command.clone().unwrap_or_default();
        if command.is_empty() {
            errs.required(format!("{at}.exec.command"));
        }
        ProbeAction::Exec { command }
    } else if let Some(h) = &p.http_get {
        ProbeAction::HttpGet(convert_http_get(errs, h, &format!("{at}.httpGet"), ports)?)
    } else if let Some(t) = &p.tcp_socket {
        ProbeAction::TcpSocket {
            host: t.host.clone().filter(|h| !h.is_empty()),
            port: resolve_port(errs, format!("{at}.tcpSocket.port"), &t.port, ports)?,
        }
    } else if let Some(g) = &p.grpc {
        // A number only: the API has no named gRPC ports.
        ProbeAction::Grpc {
            port: port_number(errs, format!("{at}.grpc.port"), i64::from(g.port))?,
            service: g.service.clone().unwrap_or_default(),
        }
    } else {
        unreachable!("one handler is set");
    };
    // The API's defaulting turns 0 into the default, so only negatives are errors.
    let num = |errs: &mut Errs, field: &str, v: Option<i32>, default: u32| match v {
        None | Some(0) => default,
        Some(v) if v < 0 => {
            errs.invalid(
                format!("{at}.{field}"),
                v,
                "must be greater than or equal to 0",
            );
            default
        }
        Some(v) => v as u32,
    };
    let success_threshold = num(errs, "successThreshold", p.success_threshold, 1);
    if kind != Kind::Readiness && success_threshold != 1 {
        errs.invalid(
            format!("{at}.successThreshold"),
            success_threshold,
            "must be 1",
        );
    }
    if p.termination_grace_period_seconds.is_some_and(|s| s < 1) {
        errs.invalid(
            format!("{at}.terminationGracePeriodSeconds"),
            p.termination_grace_period_seconds.unwrap_or_default(),
            "must be greater than 0",
        );
    }
    Some(Probe {
        action,
        initial_delay: Duration::from_secs(
            num(errs, "initialDelaySeconds", p.initial_delay_seconds, 0).into(),
        ),
        period: Duration::from_secs(num(errs, "periodSeconds", p.period_seconds, 10).into()),
        timeout: Duration::from_secs(num(errs, "timeoutSeconds", p.timeout_seconds, 1).into()),
        success_threshold,
        failure_threshold: num(errs, "failureThreshold", p.failure_threshold, 3),
    })
}

pub(super) fn convert_handler(
    errs: &mut Errs,
    h: &api::LifecycleHandler,
    at: &str,
    ports: &[ContainerPort],
) -> Option<Handler> {
    let count = [
        h.exec.is_some(),
        h.http_get.is_some(),
        h.sleep.is_some(),
        h.tcp_socket.is_some(),
    ]
    .iter()
    .filter(|h| **h)
    .count();
    if count != 1 {
        errs.invalid(
            at,
            count,
            "must have exactly one handler (exec, httpGet, sleep)",
        );
        return None;
    }
    if let Some(e) = &h.exec {
        let command = e.command.clone().unwrap_or_default();
        if command.is_empty() {
            errs.required(format!("{at}.exec.command"));
        }
        Some(Handler::Exec { command })
    } else if let Some(g) = &h.http_get {
        convert_http_get(errs, g, &format!("{at}.httpGet"), ports).map(Handler::HttpGet)
    } else if let Some(s) = &h.sleep {
        Some(Handler::Sleep(seconds(
            errs,
            format!("{at}.sleep.seconds"),
            Some(s.seconds),
            0,
        )))
    } else {
        // Deprecated and never implemented by the kubelet either.
        errs.unsupported(format!("{at}.tcpSocket"), "tcpSocket lifecycle hooks");
        None
    }
}
