//! `runAsNonRoot` against the image's user, as kuberuntime's `getImageUser`
//! and `verifyRunAsNonRoot` decide it: the container's effective
//! `runAsUser` wins; without one, the image's `User` must be a non-zero uid.
//! A name cannot be checked (the runtime resolves it inside the image, after
//! this decision), and an image without a user runs as root.
use crate::{
    cri::{ContainerSecurity, ImageInfo},
    pod::{PodSpec, SecurityContext},
};

/// Who the image runs as when the pod does not say (the config's `User`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum ImageUser {
    Uid(i64),
    Name(String),
}

impl ImageUser {
    /// `getImageUser`: a uid, else a name, else root (no `User` at all, or
    /// no image status).
    pub(super) fn of(image: Option<&ImageInfo>) -> Self {
        match image {
            Some(ImageInfo { uid: Some(uid), .. }) => Self::Uid(*uid),
            Some(i) if !i.username.is_empty() => Self::Name(i.username.clone()),
            _ => Self::Uid(0),
        }
    }
}

/// Why a container may not run under `runAsNonRoot`: it waits with
/// `CreateContainerConfigError` and this message (the kubelet's wording,
/// `<name>_<namespace>(<uid>)` as its `format.Pod`).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NonRootError {
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsUserRoot { pod: String, container: String },
    #[error(
        "container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})"
    )]
    ImageRoot { pod: String, container: String },
    #[error(
        "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root (pod: {pod:?}, container: {container})"
    )]
    ImageNonNumeric {
        user: String,
        pod: String,
        container: String,
    },
}

/// `verifyRunAsNonRoot` on the merged (container, else pod) context.
pub(super) fn verify_run_as_non_root(
    pod: &PodSpec,
    container: &str,
    sc: &SecurityContext,
    image: &ImageUser,
) -> Result<(), NonRootError> {
    if !sc.run_as_non_root {
        return Ok(());
    }
    let pod_name = format!("{}_{}({})", pod.name, pod.namespace, pod.uid);
    let container = container.to_owned();
    match (sc.run_as_user, image) {
        (Some(0), _) => Err(NonRootError::RunAsUserRoot {
            pod: pod_name,
            container,
        }),
        (Some(_), _) => Ok(()),
        (None, ImageUser::Uid(0)) => Err(NonRootError::ImageRoot {
            pod: pod_name,
            container,
        }),
        (None, ImageUser::Uid(_)) => Ok(()),
        (None, ImageUser::Name(user)) => Err(NonRootError::ImageNonNumeric {
            user: user.clone(),
            pod: pod_name,
            container,
        }),
    }
}

/// `determineEffectiveSecurityContext`'s "set RunAsUser": without a
/// `runAsUser`, the image's uid (or name) is passed on explicitly, so the
/// runtime runs exactly the user that was checked.
pub(super) fn apply_image_user(s: &mut ContainerSecurity, image: &ImageUser) {
    if s.run_as_user.is_some() {
        return;
    }
    match image {
        ImageUser::Uid(uid) => s.run_as_user = Some(*uid),
        ImageUser::Name(name) => s.run_as_username.clone_from(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodSpec {
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }))
        .unwrap();
        PodSpec::from_api(&p).unwrap()
    }

    fn sc(non_root: bool, user: Option<i64>) -> SecurityContext {
        SecurityContext {
            run_as_non_root: non_root,
            run_as_user: user,
            ..Default::default()
        }
    }

    fn image(uid: Option<i64>, username: &str) -> ImageInfo {
        ImageInfo {
            id: "sha256:x".into(),
            repo_tags: vec![],
            repo_digests: vec![],
            size: 0,
            uid,
            username: username.into(),
        }
    }

    #[test]
    fn image_user_is_uid_then_name_then_root() {
        assert_eq!(
            ImageUser::of(Some(&image(Some(5), "ignored"))),
            ImageUser::Uid(5)
        );
        assert_eq!(
            ImageUser::of(Some(&image(None, "nobody"))),
            ImageUser::Name("nobody".into())
        );
        assert_eq!(ImageUser::of(Some(&image(None, ""))), ImageUser::Uid(0));
        assert_eq!(ImageUser::of(None), ImageUser::Uid(0));
    }

    #[test]
    fn run_as_non_root_decisions() {
        let p = pod();
        let v = |s: SecurityContext, i: ImageUser| verify_run_as_non_root(&p, "c", &s, &i);
        let root = ImageUser::Uid(0);
        // Not asked: anything goes.
        assert_eq!(v(sc(false, None), root.clone()), Ok(()));
        assert_eq!(v(sc(false, Some(0)), root.clone()), Ok(()));
        // An explicit non-zero runAsUser wins over a root image.
        assert_eq!(v(sc(true, Some(65534)), root.clone()), Ok(()));
        let e = v(sc(true, Some(0)), ImageUser::Uid(1000)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "container's runAsUser breaks non-root policy (pod: \"web_ns(u1)\", container: c)"
        );
        let e = v(sc(true, None), root).unwrap_err();
        assert_eq!(
            e.to_string(),
            "container has runAsNonRoot and image will run as root (pod: \"web_ns(u1)\", container: c)"
        );
        let e = v(sc(true, None), ImageUser::Name("app".into())).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "container has runAsNonRoot and image has non-numeric user (app), cannot verify"
            ),
            "{e}"
        );
        assert_eq!(v(sc(true, None), ImageUser::Uid(1000)), Ok(()));
    }

    #[test]
    fn the_checked_image_user_is_the_one_run() {
        let mut s = ContainerSecurity::default();
        apply_image_user(&mut s, &ImageUser::Uid(0));
        assert_eq!(s.run_as_user, Some(0));
        let mut s = ContainerSecurity::default();
        apply_image_user(&mut s, &ImageUser::Name("app".into()));
        assert_eq!((s.run_as_user, s.run_as_username.as_str()), (None, "app"));
        let mut s = ContainerSecurity {
            run_as_user: Some(7),
            ..Default::default()
        };
        apply_image_user(&mut s, &ImageUser::Uid(0));
        assert_eq!((s.run_as_user, s.run_as_username.as_str()), (Some(7), ""));
    }
}
