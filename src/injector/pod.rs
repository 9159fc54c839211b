//! The shape of the injected sidecar: its container (image, ports, probes, security context,
//! admin token, config and evidence volume mounts) and the names the webhook and the chart agree
//! on. The ports are the sidecar's own listener defaults, taken from the config module, not
//! written twice.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, Probe,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::InjectorSettings;
use crate::config;

/// Name of the injected container.
pub const CONTAINER_NAME: &str = "toolgate";
/// Name of the injected ConfigMap volume.
pub const CONFIG_VOLUME: &str = "toolgate-config";
/// Where the config volume is mounted in the sidecar.
pub const CONFIG_MOUNT_PATH: &str = "/etc/toolgate";
/// Name of the injected evidence Secret volume (with `--evidence-secret`).
pub const EVIDENCE_VOLUME: &str = "toolgate-evidence";
/// Where the evidence Secret is mounted in the sidecar; the chart's `evidence.signing_key_file`
/// names a file in it.
pub const EVIDENCE_MOUNT_PATH: &str = "/var/run/secrets/toolgate/evidence";
/// Sidecar CPU request unless the pod overrides it.
pub const DEFAULT_CPU_REQUEST: &str = "50m";
/// Sidecar memory request and limit unless the pod overrides it.
pub const DEFAULT_MEMORY: &str = "64Mi";
pub const ADMIN_TOKEN_ENV: &str = "TOOLGATE_ADMIN_TOKEN";
pub const ADMIN_TOKEN_KEY: &str = "token";
pub const PORT_AGENT: i32 = config::AGENT_PORT as i32;
pub const PORT_ADMIN: i32 = config::ADMIN_PORT as i32;
pub const PORT_TELEMETRY: i32 = config::TELEMETRY_PORT as i32;
/// With a 1 s period: how long toolgate may take to start before the kubelet restarts it.
pub const STARTUP_PROBE_FAILURES: i32 = 60;
/// The config file inside the mounted ConfigMap.
pub const CONFIG_FILE: &str = "toolgate.yaml";

/// The sidecar container, ready to be serialized into the patch.
pub fn sidecar(settings: &InjectorSettings, cpu: &str, memory: &str, native: bool) -> Container {
    let port = |name: &str, number: i32| ContainerPort {
        name: Some(name.to_owned()),
        container_port: number,
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    };
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::Int(PORT_TELEMETRY),
            ..HTTPGetAction::default()
        }),
        ..Probe::default()
    };
    // A native sidecar counts as started, and the next container is started, once its startup
    // probe passes: this makes the agent wait until toolgate answers, not merely until it runs.
    let startup = Probe {
        period_seconds: Some(1),
        failure_threshold: Some(STARTUP_PROBE_FAILURES),
        ..probe("/healthz")
    };
    Container {
        name: CONTAINER_NAME.to_owned(),
        image: Some(settings.image.clone()),
        args: Some(vec![
            "serve".to_owned(),
            "--config".to_owned(),
            format!("{CONFIG_MOUNT_PATH}/{CONFIG_FILE}"),
        ]),
        // `Always` on an init container is what makes it a native sidecar (Kubernetes ≥ 1.29).
        restart_policy: native.then(|| "Always".to_owned()),
        ports: Some(vec![
            port("agent", PORT_AGENT),
            port("admin", PORT_ADMIN),
            port("telemetry", PORT_TELEMETRY),
        ]),
        readiness_probe: Some(probe("/readyz")),
        liveness_probe: Some(probe("/healthz")),
        startup_probe: Some(startup),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                ..Capabilities::default()
            }),
            // Keeps the sidecar within the `restricted` Pod Security Standard whatever the pod sets.
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..SecurityContext::default()
        }),
        env: Some(vec![EnvVar {
            name: ADMIN_TOKEN_ENV.to_owned(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: settings.admin_secret.clone(),
                    key: ADMIN_TOKEN_KEY.to_owned(),
                    ..SecretKeySelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        }]),
        volume_mounts: Some(volume_mounts(settings)),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity(cpu.to_owned())),
                ("memory".to_owned(), Quantity(memory.to_owned())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity(memory.to_owned()),
            )])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    }
}

/// The config volume, and the evidence Secret when there is one; both read-only.
fn volume_mounts(settings: &InjectorSettings) -> Vec<VolumeMount> {
    let read_only = |name: &str, path: &str| VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: Some(true),
        ..VolumeMount::default()
    };
    let mut mounts = Vec::with_capacity(2);
    mounts.push(read_only(CONFIG_VOLUME, CONFIG_MOUNT_PATH));
    if settings.evidence_secret.is_some() {
        mounts.push(read_only(EVIDENCE_VOLUME, EVIDENCE_MOUNT_PATH));
    }
    mounts
}
