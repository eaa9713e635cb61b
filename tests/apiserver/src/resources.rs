//! The kinds this server serves. Everything else about a kind (storage, watch,
//! patch) is generic; only this table and a few create/delete rules in
//! `semantics` know kinds apart.

/// One served resource (a kind at one group/version).
#[derive(Debug)]
pub struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Whether `/status` exists, and so whether writes to the main resource keep
    /// the stored `.status`.
    pub status_subresource: bool,
    /// Whether `metadata.generation` tracks `.spec` changes.
    pub generation: bool,
    pub short_names: &'static [&'static str],
    /// Field selectors the real server accepts beyond `metadata.name` and
    /// `metadata.namespace`.
    pub field_selectors: &'static [&'static str],
    /// The group of the resource whose storage this one is a view of (the
    /// same plural at v1), converted by `convert`.
    pub stored_as: Option<&'static str>,
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The store key: resources are the same across versions, so group/plural
    /// (of the storage, for a view).
    pub fn id(&self) -> String {
        format!("{}/{}", self.stored_as.unwrap_or(self.group), self.plural)
    }
}

const CORE_EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

const EVENTS_V1_FIELDS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingController",
    "type",
];

pub static RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        status_subresource: true,
        generation: false,
        short_names: &["ns"],
        field_selectors: &["status.phase"],
        stored_as: None,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        status_subresource: true,
        generation: true,
        short_names: &["po"],
        field_selectors: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        stored_as: None,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        status_subresource: true,
        generation: false,
        short_names: &["svc"],
        field_selectors: &["spec.clusterIP", "spec.type"],
        stored_as: None,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        status_subresource: true,
        generation: false,
        short_names: &["no"],
        field_selectors: &["spec.unschedulable"],
        stored_as: None,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        generation: false,
        short_names: &["ev"],
        field_selectors: CORE_EVENT_FIELDS,
        stored_as: None,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        status_subresource: false,
        generation: false,
        short_names: &["cm"],
        field_selectors: &[],
        stored_as: None,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        namespaced: true,
        status_subresource: false,
        generation: false,
        short_names: &[],
        field_selectors: &["type"],
        stored_as: None,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        namespaced: true,
        status_subresource: false,
        generation: false,
        short_names: &["sa"],
        field_selectors: &[],
        stored_as: None,
    },
    ResourceDef {
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        namespaced: true,
        status_subresource: false,
        generation: true,
        short_names: &[],
        field_selectors: &["addressType"],
        stored_as: None,
    },
    ResourceDef {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        status_subresource: false,
        generation: false,
        short_names: &[],
        field_selectors: &[],
        stored_as: None,
    },
    apps("deployments", "deployment", "Deployment", &["deploy"]),
    apps("replicasets", "replicaset", "ReplicaSet", &["rs"]),
    apps("daemonsets", "daemonset", "DaemonSet", &["ds"]),
    ResourceDef {
        group: "policy",
        version: "v1",
        plural: "poddisruptionbudgets",
        singular: "poddisruptionbudget",
        kind: "PodDisruptionBudget",
        namespaced: true,
        status_subresource: true,
        generation: true,
        short_names: &["pdb"],
        field_selectors: &[],
        stored_as: None,
    },
    ResourceDef {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        generation: false,
        // No short name: kubectl warns when "ev" is ambiguous.
        short_names: &[],
        field_selectors: EVENTS_V1_FIELDS,
        // One resource with core/v1 Events, as upstream: either API reads
        // what the other wrote.
        stored_as: Some(""),
    },
    // RBAC objects are stored as they are; `rbac` evaluates them for
    // SubjectAccessReviews (the kubelet's webhook authorizer asks those).
    rbac("roles", "role", "Role", true),
    rbac("rolebindings", "rolebinding", "RoleBinding", true),
    rbac("clusterroles", "clusterrole", "ClusterRole", false),
    rbac(
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
    ),
];

const fn apps(
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    short_names: &'static [&'static str],
) -> ResourceDef {
    ResourceDef {
        group: "apps",
        version: "v1",
        plural,
        singular,
        kind,
        namespaced: true,
        status_subresource: true,
        generation: true,
        short_names,
        field_selectors: &[],
        stored_as: None,
    }
}

const fn rbac(
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> ResourceDef {
    ResourceDef {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural,
        singular,
        kind,
        namespaced,
        status_subresource: false,
        generation: false,
        short_names: &[],
        field_selectors: &[],
        stored_as: None,
    }
}

/// The API groups in discovery order (the core group is served under `/api`).
pub fn groups() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.contains(&r.group) {
            out.push(r.group);
        }
    }
    out
}

pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

pub fn in_group_version(group: &str, version: &str) -> impl Iterator<Item = &'static ResourceDef> {
    RESOURCES
        .iter()
        .filter(move |r| r.group == group && r.version == version)
}

pub fn namespaces() -> &'static ResourceDef {
    &RESOURCES[0]
}

/// The namespaced resources, each storage once (a namespace's deletion
/// removes their objects).
pub fn namespaced() -> impl Iterator<Item = &'static ResourceDef> {
    RESOURCES
        .iter()
        .filter(|r| r.namespaced && r.stored_as.is_none())
}
