"""The Kubernetes manifests under docker/k8s/: valid against the Kubernetes schemas
(kubernetes-validate, strict: no unknown fields), every `joader serve` flag and JOADER_*
variable they use exists in `joader serve --help`, and their pieces agree with each other (the
nodes follow the leader's Service, the shared memory's group is one the pods belong to)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("JOADER_BIN", ROOT / "target" / "debug" / "joader"))
K8S = ROOT / "docker" / "k8s"
# Read by the server's logger (tracing's EnvFilter), not by clap: documented in the README.
NOT_FLAGS = {"JOADER_LOG"}


def documents() -> List[Tuple[str, Dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return docs


def by_kind(kind: str) -> List[Dict[str, Any]]:
    return [d for _, d in documents() if d["kind"] == kind]


def pod_spec(doc: Dict[str, Any]) -> Dict[str, Any]:
    return doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]


def joader_containers() -> Iterator[Tuple[Dict[str, Any], Dict[str, Any]]]:
    for _, doc in documents():
        if doc["kind"] in ("Pod", "DaemonSet", "StatefulSet", "Deployment"):
            for c in pod_spec(doc)["containers"]:
                if c["image"].split(":")[0].endswith("joader"):
                    yield doc, c


def test_there_are_the_manifests_the_issue_asks_for() -> None:
    kinds = {d["kind"] for _, d in documents()}
    assert {"Namespace", "Service", "StatefulSet", "DaemonSet"} <= kinds
    (leader,) = by_kind("StatefulSet")
    assert leader["spec"]["replicas"] == 1
    assert len(list(joader_containers())) == 2


@pytest.mark.parametrize("name,doc", documents(), ids=[n for n, _ in documents()])
def test_each_manifest_is_valid_against_the_kubernetes_schema(name: str, doc: Dict[str, Any]) -> None:
    version = kubernetes_validate.latest_version()
    kubernetes_validate.validate(doc, version, strict=True)


def test_an_invalid_manifest_is_caught() -> None:
    """The validation above can fail: an unknown field is an error."""
    (ds,) = by_kind("DaemonSet")
    ds["spec"]["template"]["spec"]["hostShm"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, kubernetes_validate.latest_version(), strict=True)


def test_every_flag_and_variable_exists_in_joader_serve_help() -> None:
    assert BIN.exists(), f"{BIN} is missing: build it with cargo build -p joader-tools"
    help_text = subprocess.run([str(BIN), "serve", "--help"], check=True, capture_output=True, text=True).stdout
    flags = set(re.findall(r"(--[a-z][a-z-]*)", help_text))
    env = set(re.findall(r"env: (JOADER_[A-Z_]+)", help_text))
    used = 0
    for doc, c in joader_containers():
        args = c.get("command", [])[1:] + c.get("args", [])
        assert args[0] == "serve", c["name"]
        for a in args[1:]:
            assert a.startswith("--"), f"{doc['metadata']['name']}: {a} is not a flag"
            flag = a.split("=", 1)[0]
            assert flag in flags, f"{doc['metadata']['name']} uses {flag}, not in joader serve --help"
            used += 1
        for e in c.get("env", []):
            if e["name"].startswith("JOADER_") and e["name"] not in NOT_FLAGS:
                assert e["name"] in env, f"{doc['metadata']['name']} sets {e['name']}, not in joader serve --help"
                used += 1
    assert used > 10
    # Read by the server's logger: documented where the deployment is.
    assert "JOADER_LOG" in (ROOT / "docs" / "cluster.md").read_text()


def test_the_pieces_agree() -> None:
    (svc,) = by_kind("Service")
    (leader,) = by_kind("StatefulSet")
    (nodes,) = by_kind("DaemonSet")
    (train,) = by_kind("Pod")
    assert leader["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["selector"].items() <= leader["spec"]["template"]["metadata"]["labels"].items()
    (c,) = pod_spec(nodes)["containers"]
    arg = {a.split("=", 1)[0]: a.split("=", 1)[-1] for a in c["args"][1:]}
    ns = leader["metadata"]["namespace"]
    assert arg["--leader"] == f"http://{leader['metadata']['name']}-0.{svc['metadata']['name']}.{ns}.svc:7480"
    (lc,) = pod_spec(leader)["containers"]
    assert "--leader-only" in lc["args"]
    # Shared memory: the node's /dev/shm on both sides, a group both belong to.
    gid = int(arg["--shm-gid"])
    assert int(arg["--shm-mode"], 8) & 0o060 == 0o060
    for spec in (pod_spec(nodes), pod_spec(train)):
        assert gid in spec["securityContext"]["supplementalGroups"]
        shm = [v for v in spec["volumes"] if v.get("hostPath", {}).get("path") == "/dev/shm"]
        assert len(shm) == 1
        mounts = [m for ct in spec["containers"] for m in ct["volumeMounts"] if m["name"] == shm[0]["name"]]
        assert [m["mountPath"] for m in mounts] == ["/dev/shm"]
    # Prometheus scrapes both.
    for d in (leader, nodes):
        ann = d["spec"]["template"]["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"
    # Node names are stable across restarts (placement hashes them).
    env = {e["name"]: e for e in c["env"]}
    assert env["JOADER_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
