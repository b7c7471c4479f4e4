"""k8s/, validated offline: the committed manifests are what the topology source renders (so Kubernetes, compose and
`grpo-fleet up` cannot drift apart), they run compose's commands, and they hang together -- selectors match pod
labels, Services reach declared ports, claims exist, probes name served ports, every config validates."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.config import load_config
from launch import k8s
from launch.topology import ROLE_COMMANDS, SERVICE_PORTS, container_command

ROOT = Path(__file__).resolve().parents[3]
DOCS: list[dict[str, Any]] = [d for d in yaml.safe_load_all((ROOT / "k8s" / "grpo-fleet.yaml").read_text()) if d]
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
WORKLOADS = {"Deployment", "StatefulSet", "Job"}


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in DOCS if d["kind"] == kind}


def _pods() -> dict[str, dict[str, Any]]:
    """Workload name -> its pod template."""
    return {d["metadata"]["name"]: d["spec"]["template"] for d in DOCS if d["kind"] in WORKLOADS}


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


def test_committed_manifests_are_what_the_topology_renders() -> None:
    assert k8s.main(["--check"]) == 0, "k8s/grpo-fleet.yaml is stale: run `python -m launch.k8s`"


def test_every_topology_service_runs_with_redis_on_a_persistent_volume() -> None:
    pods = _pods()
    assert set(pods) == set(ROLE_COMMANDS) | {"redis"}
    redis = _by_kind("StatefulSet")["redis"]
    assert redis["spec"]["volumeClaimTemplates"][0]["spec"]["accessModes"] == ["ReadWriteOnce"]
    command = redis["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["redis-server", "--appendonly", "yes"] and "/data" in command


@pytest.mark.parametrize("role", ["replay-buffer", "sandbox", "rollout"])
def test_service_commands_are_compose_commands_with_the_cluster_config(role: str) -> None:
    container = _pods()[role]["spec"]["containers"][0]
    assert container["command"] == container_command(role, k8s.CONFIG)
    compose = [k8s.CONFIG if c.startswith("${GRPO_FLEET_CONFIG") else c for c in COMPOSE[role]["command"]]
    assert container["command"] == compose


def test_trainer_is_an_indexed_torchrun_job_over_several_nodes() -> None:
    job = _by_kind("Job")["trainer"]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == k8s.TRAINER_NODES > 1
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    expected = container_command("trainer", k8s.CONFIG, torchrun=k8s.trainer_torchrun())
    assert command[:len(expected)] == expected and "--node-rank=$(NODE_RANK)" in command
    compose = [k8s.CONFIG if c.startswith("${GRPO_FLEET_CONFIG") else c for c in COMPOSE["trainer"]["command"]]
    script = compose.index("trainer/main.py")
    assert command[expected.index("trainer/main.py"):len(expected)] == compose[script:]  # same script and wiring
    assert _by_kind("Service")["trainer-nodes"]["spec"]["clusterIP"] == "None"  # trainer-0.trainer-nodes resolves


def test_rollout_scales_as_a_deployment_without_a_service() -> None:
    assert _by_kind("Deployment")["rollout"]["spec"]["replicas"] >= 2
    assert "rollout" not in _by_kind("Service")


def test_every_config_with_its_overrides_validates() -> None:
    for pod in _pods().values():
        for c in _containers(pod):
            if "--config" in c.get("command", []):
                i = c["command"].index("--config")
                load_config(ROOT / c["command"][i + 1], c["command"][i + 2:])


def test_selectors_match_their_pod_labels_and_services_reach_declared_ports() -> None:
    pods = _pods()
    for name, d in [(n, d) for n, d in ((d["metadata"]["name"], d) for d in DOCS) if d["kind"] in WORKLOADS - {"Job"}]:
        labels = pods[name]["metadata"]["labels"]
        assert d["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
    for name, svc in _by_kind("Service").items():
        selector = {k: v for k, v in svc["spec"]["selector"].items() if not k.startswith("batch.kubernetes.io/")}
        targets = [p for p in pods.values() if selector.items() <= p["metadata"]["labels"].items()]
        assert targets, f"Service {name} selects no pod"
        declared = {p["containerPort"] for t in targets for c in t["spec"]["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= declared, name
    for role in ("replay-buffer", "sandbox", "trainer"):
        assert _by_kind("Service")[role]["spec"]["ports"][0]["port"] == SERVICE_PORTS[role]


def test_claims_exist_and_probes_name_served_ports() -> None:
    claims = set(_by_kind("PersistentVolumeClaim"))
    for name, pod in _pods().items():
        for v in pod["spec"].get("volumes", []):
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims, name
        mounts = {v["name"] for v in pod["spec"].get("volumes", [])} | {"data"}
        for c in _containers(pod):
            assert {m["name"] for m in c.get("volumeMounts", [])} <= mounts, (name, c["name"])
            for kind in ("readinessProbe", "startupProbe", "livenessProbe"):
                probe = c.get(kind, {})
                port = (probe.get("grpc") or probe.get("httpGet") or {}).get("port")
                if port is not None:
                    assert port in {p["containerPort"] for p in c["ports"]}, (name, kind)


def test_only_bubblewrap_pods_get_its_security_options() -> None:
    for name, pod in _pods().items():
        for c in _containers(pod):
            sec = c.get("securityContext")
            if c["name"] == "prepare" or name == "sandbox":
                assert sec == k8s._bwrap_security(), (name, c["name"])
            else:
                assert sec is None, (name, c["name"])
            assert not (sec or {}).get("privileged"), name


def test_kustomization_applies_the_manifests_and_names_the_images() -> None:
    kust = yaml.safe_load((ROOT / "k8s" / "kustomization.yaml").read_text())
    assert kust["resources"] == ["grpo-fleet.yaml"]
    images = {c["image"].split(":")[0] for p in _pods().values() for c in _containers(p)}
    assert images == {i["name"] for i in kust["images"]}


def test_every_fleet_service_is_restarted_when_it_stops_answering_not_only_when_it_exits() -> None:
    # A wedged rollout worker (its process alive, its loop no longer answering) is what Kubernetes cannot see by
    # itself: the liveness probe calls the service (gRPC health, or the sandbox's /healthz) with a timeout.
    for name in ("rollout", "replay-buffer", "sandbox"):
        [c] = [c for c in _containers(_pods()[name]) if c["name"] == name]
        live = c["livenessProbe"]
        assert live.get("grpc") or live.get("httpGet"), (name, live)  # a call, not `exec: [true]` or a pid check
        assert live["timeoutSeconds"] <= 10 and live["periodSeconds"] * live["failureThreshold"] <= 60, (name, live)
        # ... and not while the engine loads: the startup probe holds it off for minutes.
        start = c["startupProbe"]
        assert start["periodSeconds"] * start["failureThreshold"] >= 600, (name, start)
