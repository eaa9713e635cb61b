//! The k8s-to-domain conversion of Services and EndpointSlices on its own,
//! fed the wire types the API-server source decodes (JSON), so mutations
//! reach the validation rather than stopping in the YAML parser. Oracle: a
//! conversion is a pure function of the object.
#![no_main]

use k8s_openapi::api::core::v1::Service;
use libfuzzer_sys::fuzz_target;
use weir_agent::k8s::{self, wire::EndpointSlice};

fuzz_target!(|data: &[u8]| {
    if let Ok(svc) = serde_json::from_slice::<Service>(data) {
        let a = k8s::service(&svc);
        assert_eq!(a, k8s::service(&svc));
        // Display is what the agent logs and puts into Events.
        match a {
            Ok(c) => c.warnings.iter().for_each(|w| drop(w.to_string())),
            Err(e) => drop(e.to_string()),
        }
    }
    if let Ok(eps) = serde_json::from_slice::<EndpointSlice>(data) {
        let a = k8s::slice(&eps);
        assert_eq!(a, k8s::slice(&eps));
        if let Err(e) = a {
            drop(e.to_string());
        }
    }
});
