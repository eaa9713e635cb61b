//! healthCheckNodePort servers for `externalTrafficPolicy: Local` Services.
//! (Stub interface; the node-runtime work fills it in.)
use crate::model::ServiceId;

#[derive(Debug, Default)]
pub struct HealthChecks {}

impl HealthChecks {
    /// The Service wants a health check on `node_port` reporting `local_endpoints`.
    pub fn set(&self, _svc: &ServiceId, _node_port: u16, _local_endpoints: usize) {}

    /// The Service no longer has a health check.
    pub fn remove(&self, _svc: &ServiceId) {}
}
