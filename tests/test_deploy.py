"""The manifests in deploy/ parse, and say what the server does: probe paths that are
its health routes, the port it listens on by default, a grace period that covers the
preStop pause and the drain, and an InferencePool that selects the Deployment's pods
on the port they serve. They also run the image the Containerfile builds as it is: its
name and version, its port, its user, its read-only root and its one volume."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

import loopback
from ovtrio.settings.server import Settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
# How long ovtrio lets in-flight requests finish after SIGTERM (its drain timeout).
DRAIN_SECONDS = Settings.model_fields["drain_timeout"].default
DEFAULT_PORT = Settings.model_fields["port"].default


def documents() -> dict[str, dict]:
    found: dict[str, dict] = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            assert {"apiVersion", "kind", "metadata"} <= set(document), path
            found[document["kind"]] = document
    return found


MANIFESTS = documents()


def container() -> dict:
    return MANIFESTS["Deployment"]["spec"]["template"]["spec"]["containers"][0]


def port_number(name_or_number: str | int) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    (port,) = [p for p in container()["ports"] if p["name"] == name_or_number]
    return port["containerPort"]


def test_every_manifest_is_there():
    assert set(MANIFESTS) == {"Deployment", "Service", "InferencePool", "HTTPRoute"}
    assert MANIFESTS["InferencePool"]["apiVersion"] == "inference.networking.k8s.io/v1"


def test_the_container_listens_where_the_server_does():
    args = container()["args"]
    assert args[0] == "serve"
    assert int(args[args.index("--port") + 1]) == DEFAULT_PORT == port_number("http")
    assert args[args.index("--host") + 1] == "0.0.0.0"


@pytest.mark.parametrize(
    "probe, path",
    [
        ("startupProbe", "/health"),
        ("livenessProbe", "/health"),
        ("readinessProbe", "/health/ready"),
    ],
)
def test_probes_use_the_health_routes(server, probe, path):
    check = container()[probe]["httpGet"]
    assert check["path"] == path and port_number(check["port"]) == DEFAULT_PORT
    response = loopback.get(server.base_url + check["path"], timeout=30)  # the route answers as a probe wants
    assert response.status_code == 200, response.text


def test_the_grace_period_covers_the_pause_and_the_drain():
    pod = MANIFESTS["Deployment"]["spec"]["template"]["spec"]
    pause = container()["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pause + drain_timeout()


def drain_timeout() -> float:
    """The drain the container runs with: its flag or variable, else the default."""
    args = container()["args"]
    if "--drain-timeout" in args:
        return float(args[args.index("--drain-timeout") + 1])
    env = {e["name"]: e.get("value") for e in container().get("env", [])}
    return float(env.get("OVTRIO_DRAIN_TIMEOUT") or DRAIN_SECONDS)


def test_service_and_pool_select_the_deployments_pods():
    labels = MANIFESTS["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert MANIFESTS["Deployment"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = MANIFESTS["Service"]["spec"]
    assert service["selector"].items() <= labels.items()
    assert [port_number(p["targetPort"]) for p in service["ports"]] == [DEFAULT_PORT]
    pool = MANIFESTS["InferencePool"]["spec"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    assert [p["number"] for p in pool["targetPorts"]] == [DEFAULT_PORT]
    assert pool["endpointPickerRef"]["name"] and pool["endpointPickerRef"]["port"]["number"]


def test_the_route_sends_traffic_to_the_pool():
    backends = [ref for rule in MANIFESTS["HTTPRoute"]["spec"]["rules"] for ref in rule["backendRefs"]]
    assert backends == [
        {
            "group": "inference.networking.k8s.io",
            "kind": "InferencePool",
            "name": MANIFESTS["InferencePool"]["metadata"]["name"],
        }
    ]


# The image.


def containerfile() -> list[tuple[str, str]]:
    """The final stage's instructions of the Containerfile: (keyword, arguments), with
    continued lines joined and comments left out."""
    lines, joined = [], ""
    for line in (ROOT / "Containerfile").read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("#") and not joined:
            continue
        joined += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            if joined.strip():
                lines.append(joined.strip())
            joined = ""
    instructions = [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


IMAGE = containerfile()


def image(keyword: str) -> list[str]:
    return [arguments for found, arguments in IMAGE if found == keyword]


def image_pairs(keyword: str) -> dict[str, str]:
    """The KEY=VALUE pairs of every ENV, LABEL or ARG of the final stage."""
    return dict(pair.split("=", 1) for arguments in image(keyword) for pair in shlex.split(arguments) if "=" in pair)


VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def test_the_deployment_runs_the_image_the_containerfile_builds():
    assert container()["image"] == f"ovtrio:{VERSION}"  # scripts/build-image's tag
    assert image_pairs("ARG")["VERSION"] == VERSION
    labels = image_pairs("LABEL")
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert "org.opencontainers.image.source" in labels
    assert image("ENTRYPOINT") == ['["ovtrio"]'] and container()["args"][0] == "serve"


def test_the_image_listens_where_the_deployment_looks():
    assert image("EXPOSE") == [str(DEFAULT_PORT)] == [str(port_number("http"))]
    assert int(image_pairs("ENV")["OVTRIO_PORT"]) == DEFAULT_PORT
    assert image("STOPSIGNAL") == ["SIGTERM"]  # what the kubelet sends, and what starts the drain


def test_the_pod_runs_as_the_images_user_on_a_read_only_root():
    (user,) = image("USER")
    uid, gid = (int(part) for part in user.split(":"))
    assert uid != 0
    pod = MANIFESTS["Deployment"]["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True and (pod["runAsUser"], pod["runAsGroup"]) == (uid, gid)
    assert container()["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_pods_one_volume_is_the_images_data_dir():
    (volume,) = image("VOLUME")
    assert image_pairs("ENV")["OVTRIO_DATA_DIR"] == volume
    pod = MANIFESTS["Deployment"]["spec"]["template"]["spec"]
    (mount,) = container()["volumeMounts"]
    assert mount["mountPath"] == volume
    assert [v["name"] for v in pod["volumes"]] == [mount["name"]]
    env = {e["name"]: e.get("value") for e in container().get("env", [])}
    assert "OVTRIO_DATA_DIR" not in env and "OVTRIO_CACHE_DIR" not in env  # nothing writes elsewhere
