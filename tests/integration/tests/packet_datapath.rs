//! The packet datapath end to end (issue 3): an external client, a node running
//! the agent on its devices, a local pod and a pod behind a second node, all
//! dual-stack, with real clients (curl, dig against dnsmasq, UDP sockets).
//! Needs root. Every test builds its own topology (its own namespaces, cgroup
//! and bpffs), so they can run in parallel.
//!
//! | module | shows |
//! |---|---|
//! | `topology` | the topology routes every path without the agent, and leaves nothing behind |
//! | `external` | NodePort, ExternalIP, LB IP over TCP/UDP/DNS, v4 and v6; SNAT for Cluster, client source for Local; health-check NodePort |
//! | `affinity` | ClientIP affinity holds within its timeout, is released after |
//! | `source_ranges` | loadBalancerSourceRanges admit and drop, with the drop counter |
//! | `in_cluster` | pods reaching external frontends: eTP Local serves them from every endpoint; NodePort hairpin SNATed to the node; source ranges drop pods even with socket LB |
//! | `lifecycle` | streams survive terminating; new flows avoid terminating and removed backends; a tracked UDP flow leaves a removed backend; conntrack listed |
//! | `maglev` | Maglev frontends: each flow from outside reaches the backend its tuple hashes to in the table; a second node's agent agrees on 10,000 tuples; a removed backend leaves the table |
//! | `collector` | the conntrack collector removes idle flows' entries and keeps a live flow's |
//! | `devices` | a device that appears, vanishes and comes back while the agent runs gets the program, loses it and gets it again, from the kernel's link notifications alone |
//! | `xdp` | native XDP counters and flows; best-effort fallback (with its warning) to TC on a device without native XDP (a bridge: this kernel has no `dummy`), with traffic through it |
//! | `clusterip` | per-packet ClusterIP (hairpin, internalTrafficPolicy Local); a pod's connected UDP socket leaves a removed backend |
//! | `bad_input` | field-named errors for the new fields, at start and at runtime; good Services keep working |
//! | `kernel_run` | `BPF_PROG_TEST_RUN` of the attached TC and XDP programs over the agent's maps: exact DNAT, SNAT and rev-NAT frames (v4, v6, TCP, UDP) with every checksum verified, eTP=Local and source-range drops, affinity, untranslated frames passed byte for byte |
//! | `verifier` | every attached program's verified instruction count stays within its budget |
//! | `hardening` | forged ACK floods evict no flow; forged replies from a pod or the backend's side neither close nor remove SNAT flows; SNAT ports found at 90-99% use, exhaustion counted |
#[path = "packet_datapath/support.rs"]
mod support;

#[path = "packet_datapath/affinity.rs"]
mod affinity;
#[path = "packet_datapath/bad_input.rs"]
mod bad_input;
#[path = "packet_datapath/clusterip.rs"]
mod clusterip;
#[path = "packet_datapath/collector.rs"]
mod collector;
#[path = "packet_datapath/devices.rs"]
mod devices;
#[path = "packet_datapath/external.rs"]
mod external;
#[path = "packet_datapath/hardening.rs"]
mod hardening;
#[path = "packet_datapath/in_cluster.rs"]
mod in_cluster;
#[path = "packet_datapath/kernel_run.rs"]
mod kernel_run;
#[path = "packet_datapath/lifecycle.rs"]
mod lifecycle;
#[path = "packet_datapath/maglev.rs"]
mod maglev;
#[path = "packet_datapath/source_ranges.rs"]
mod source_ranges;
#[path = "packet_datapath/topology.rs"]
mod topology;
#[path = "packet_datapath/verifier.rs"]
mod verifier;
#[path = "packet_datapath/xdp.rs"]
mod xdp;
