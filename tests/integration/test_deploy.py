"""deploy/: the Kubernetes manifests validate offline against the Kubernetes schemas
(kubernetes-validate, strict), the systemd units pass ``systemd-analyze verify``, the
container image definition is linted (no container builder runs in CI: this machine has
no podman, buildah or docker daemon), and every setting they pass is one of
triplane/config.py's schema."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from triplane.config import FIELDS, load

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
K8S_VERSION = "1.30.0"
# Variables triplane reads besides the schema's (secrets, where the file and run dir are).
OTHER_VARS = {"TRIPLANE_SECRET", "TRIPLANE_TOKEN", "TRIPLANE_CONFIG", "TRIPLANE_HOME"}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _resources() -> dict[Path, list[dict[str, Any]]]:
    return {p: _docs(p) for p in sorted(K8S.rglob("*.yaml")) if p.name != "kustomization.yaml"
            and p.parent.name == "base"}


def _validate(doc: dict[str, Any]) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate ([dev])")
    kv.validate(doc, K8S_VERSION, strict=True)


def _merge(base: Any, patch: Any) -> Any:
    """A strategic merge as kustomize does it for these patches: maps merge, lists of maps
    merge by ``name``."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = _merge(base[k], v) if k in base else v
        return out
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(x, dict) for x in base + patch):
        out_list = [copy.deepcopy(x) for x in base]
        for item in patch:
            match = next((i for i, x in enumerate(out_list) if x.get("name") == item.get("name")), None)
            if match is None:
                out_list.append(item)
            else:
                out_list[match] = _merge(out_list[match], item)
        return out_list
    return patch


def _by_kind(kind: str) -> dict[str, Any]:
    return next(d for docs in _resources().values() for d in docs if d["kind"] == kind)


def test_every_manifest_validates_against_the_kubernetes_schemas() -> None:
    seen = []
    for docs in _resources().values():
        for doc in docs:
            _validate(doc)
            seen.append(f"{doc['kind']}/{doc['metadata']['name']}")
    assert {"Deployment/triplane-scheduler", "StatefulSet/triplane-executor", "Service/triplane-scheduler",
            "Secret/triplane-secrets", "ConfigMap/triplane-config"} <= set(seen), seen
    # The check can fail: a wrong type or an unknown field is rejected.
    kv = pytest.importorskip("kubernetes_validate")
    bad = copy.deepcopy(_by_kind("Deployment"))
    bad["spec"]["replicas"] = "two"
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSION, strict=True)
    bad = copy.deepcopy(_by_kind("StatefulSet"))
    bad["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSION, strict=True)


def test_kustomizations_name_files_that_exist_and_the_gpu_overlay_validates() -> None:
    for k in K8S.rglob("kustomization.yaml"):
        spec = yaml.safe_load(k.read_text())
        for entry in spec.get("resources", []) + [p["path"] for p in spec.get("patches", [])]:
            assert (k.parent / entry).exists(), f"{k} names {entry}, which does not exist"
    base = _by_kind("StatefulSet")
    patch = _docs(K8S / "overlays" / "gpu" / "executor-gpu.yaml")[0]
    merged = _merge(base, patch)
    _validate(merged)
    container = merged["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["requests"]["cpu"] == base["spec"]["template"]["spec"]["containers"][0][
        "resources"]["requests"]["cpu"]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the overlay was merged by this test only")
    for overlay in (K8S / "base", K8S / "overlays" / "gpu"):
        out = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=60,
                             check=False)
        assert out.returncode == 0, out.stderr
        for doc in (d for d in yaml.safe_load_all(out.stdout) if d):
            _validate(doc)


def _env_of(container: dict[str, Any], configmap: dict[str, Any]) -> dict[str, str]:
    env = dict(configmap["data"])
    for e in container.get("env", []):
        env[e["name"]] = e.get("value", "10.1.2.3" if "fieldRef" in e.get("valueFrom", {}) else "x" * 32)
    return env


def test_the_manifests_speak_the_config_schema_and_probe_the_health_endpoints() -> None:
    known = {f.env for f in FIELDS} | OTHER_VARS
    configmap = _by_kind("ConfigMap")
    for kind, role in (("Deployment", "scheduler"), ("StatefulSet", "executor")):
        spec = _by_kind(kind)["spec"]
        container = spec["template"]["spec"]["containers"][0]
        assert container["args"] == [role]
        env = _env_of(container, configmap)
        unknown = sorted(k for k in env if k.startswith("TRIPLANE_") and k not in known)
        assert not unknown, f"{kind} sets variables triplane does not read: {unknown}"
        cfg = load(role, env=env)
        assert cfg["bind"] == "0.0.0.0" and cfg["advertise"] == "10.1.2.3"
        assert cfg["registry"].startswith("etcd://")
        secrets = {e["name"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})}
        assert "TRIPLANE_SECRET" in secrets
        assert container["resources"]["requests"]
    sched = _by_kind("Deployment")["spec"]
    assert sched["replicas"] == 2
    probes = sched["template"]["spec"]["containers"][0]
    assert probes["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert probes["livenessProbe"]["httpGet"]["path"] == "/health"
    # No real secret in the repository: the example's placeholders are too short to start
    # triplane, and the kustomization does not apply it over the real Secret.
    data = _by_kind("Secret")["stringData"]
    assert all(len(data[k]) < 16 for k in ("secret", "token"))
    listed = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())["resources"]
    assert "secret.example.yaml" not in listed


def test_the_systemd_units_verify(tmp_path: Path) -> None:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze is not installed")
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        text = unit.read_text()
        assert "LoadCredential=secret:" in text and "--secret" not in text and "TRIPLANE_SECRET=" not in text
        # The units name /opt/triplane's venv; here, an executable that exists.
        (tmp_path / unit.name).write_text(text.replace("/opt/triplane/bin/triplane", sys.executable))
        r = subprocess.run([exe, "verify", str(tmp_path / unit.name)], capture_output=True, text=True,
                           timeout=60, check=False)
        ours = [line for line in (r.stdout + r.stderr).splitlines() if unit.name in line]
        assert r.returncode == 0 and not ours, r.stdout + r.stderr
    # ... and verify would say so if one were wrong
    bad = tmp_path / "bad.service"
    bad.write_text((tmp_path / "triplane-executor.service").read_text().replace("Restart=always",
                                                                                 "Restart=sometimes"))
    r = subprocess.run([exe, "verify", str(bad)], capture_output=True, text=True, timeout=60, check=False)
    assert "bad.service" in r.stdout + r.stderr


def test_the_example_config_loads_for_both_roles() -> None:
    for role in ("scheduler", "executor"):
        cfg = load(role, config_file=DEPLOY / "systemd" / "triplane.toml", env={})
        assert cfg["registry"].startswith("etcd://") and cfg["bind"] == "0.0.0.0"


def test_the_container_image_definition_lints() -> None:
    text = (DEPLOY / "container" / "Containerfile").read_text()
    lines = [line for line in re.sub(r"\\\n", " ", text).splitlines() if line.strip() and
             not line.lstrip().startswith("#")]
    keywords = {"FROM", "WORKDIR", "COPY", "RUN", "ENV", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "ARG",
                "LABEL"}
    for line in lines:
        assert line.split()[0] in keywords, f"unknown instruction: {line}"
    froms = [line.split()[1] for line in lines if line.startswith("FROM")]
    assert froms and all(":" in f and not f.endswith(":latest") for f in froms), froms
    for line in lines:
        if line.startswith("COPY") and "--from=" not in line:
            for src in line.split()[1:-1]:
                assert (REPO / src).exists(), f"COPY {src}: no such path in the repository"
    final = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM")):]
    user = [line.split()[1] for line in final if line.startswith("USER")]
    assert user and not user[-1].startswith(("0", "root")), "the final stage must not run as root"
    assert 'ENTRYPOINT ["triplane"]' in final, "one image: the command (scheduler, executor) picks the role"
    assert not re.search(r"TRIPLANE_(SECRET|TOKEN)\s*=", text), "no secret baked into the image"
