//! Node-pressure eviction, as the kubelet's eviction manager does it: when
//! memory or local storage runs short of a threshold, the node reports
//! MemoryPressure or DiskPressure and the pods that use the most beyond
//! what they requested are stopped, one per round, and left Failed with
//! reason Evicted.
//!
//! ```text
//!  every 10 s: observe (meminfo, statvfs root dir / image fs)
//!      │
//!      ▼
//!  decide (pure): thresholds met, soft ones past their grace ──▶ MemoryPressure / DiskPressure
//!      │ a threshold to reclaim for                               (NodeHealth → Node conditions;
//!      ▼                                                           the taints come from the
//!  rank (pure): over requests, priority, usage − requests          node lifecycle controller)
//!      │ first pod (never static or system-critical)
//!      ▼
//!  worker: stop it (grace 0 hard, evictionMaxPodGracePeriod soft), Event
//!          Evicted, phase Failed, DisruptionTarget, volumes torn down
//! ```
pub mod decide;
pub mod manager;
pub mod observe;
pub mod rank;
pub mod thresholds;

pub use manager::EvictionManager;
pub use thresholds::EvictionConfig;
