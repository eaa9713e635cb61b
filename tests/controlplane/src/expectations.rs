//! What a controller wrote and has not yet seen in its caches (upstream's
//! `ControllerExpectations`). A pass that decided from a cache missing its
//! own last writes would create or delete twice; an owner with unmet
//! expectations waits, up to a deadline in case an event was lost.
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

/// How long an expectation may stay unmet before the owner is decided
/// again anyway (upstream: 5 minutes; tests have no patience for that).
const DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
struct Pending {
    created: HashSet<String>,
    deleted: HashSet<String>,
    since: Option<Instant>,
}

/// Per owner (uid): the names it created and deleted.
#[derive(Debug, Default)]
pub struct Expectations(HashMap<String, Pending>);

impl Expectations {
    pub fn created(&mut self, owner: &str, name: &str) {
        let p = self.0.entry(owner.to_string()).or_default();
        p.created.insert(name.to_string());
        p.since.get_or_insert_with(Instant::now);
    }

    pub fn deleted(&mut self, owner: &str, name: &str) {
        let p = self.0.entry(owner.to_string()).or_default();
        p.deleted.insert(name.to_string());
        p.since.get_or_insert_with(Instant::now);
    }

    /// Whether `owner` may be decided: everything it created is in the
    /// cache (`exists`) and everything it deleted is gone or going
    /// (`!active`). Met expectations are forgotten.
    pub fn satisfied(
        &mut self,
        owner: &str,
        exists: impl Fn(&str) -> bool,
        active: impl Fn(&str) -> bool,
    ) -> bool {
        let Some(p) = self.0.get(owner) else {
            return true;
        };
        let met = p.created.iter().all(|n| exists(n)) && p.deleted.iter().all(|n| !active(n));
        let expired = p.since.is_some_and(|t| t.elapsed() > DEADLINE);
        if met || expired {
            if expired && !met {
                tracing::warn!("expectations of {owner} unmet after {DEADLINE:?}; deciding anyway");
            }
            self.0.remove(owner);
            return true;
        }
        false
    }
}

impl Expectations {
    /// [`Self::satisfied`] against the pods an owner's pass sees.
    pub fn satisfied_by(&mut self, owner: &str, pods: &[&k8s_openapi::api::core::v1::Pod]) -> bool {
        let find = |name: &str| {
            pods.iter()
                .find(|p| p.metadata.name.as_deref() == Some(name))
        };
        self.satisfied(
            owner,
            |n| find(n).is_some(),
            |n| find(n).is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
        )
    }
}

/// Creates and deletes an owner's pods, expecting each write to be seen.
pub async fn write_pods(
    api: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    expect: &std::sync::Mutex<Expectations>,
    owner: &str,
    create: impl IntoIterator<Item = k8s_openapi::api::core::v1::Pod>,
    delete: &[String],
) -> anyhow::Result<()> {
    let lock = || expect.lock().unwrap_or_else(|e| e.into_inner());
    for pod in create {
        let created = api.create(&Default::default(), &pod).await?;
        lock().created(owner, &created.metadata.name.unwrap_or_default());
    }
    for name in delete {
        match api.delete(name, &Default::default()).await {
            Ok(_) => lock().deleted(owner, name),
            Err(kube::Error::Api(e)) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_waits_until_its_writes_are_seen() {
        let mut e = Expectations::default();
        assert!(e.satisfied("rs", |_| false, |_| true), "nothing expected");
        e.created("rs", "p1");
        e.deleted("rs", "p0");
        assert!(
            !e.satisfied("rs", |n| n == "p1", |n| n == "p0"),
            "p0 still active"
        );
        assert!(!e.satisfied("rs", |_| false, |_| false), "p1 not seen");
        assert!(e.satisfied("rs", |n| n == "p1", |_| false));
        assert!(e.satisfied("rs", |_| false, |_| true), "forgotten once met");
    }
}
