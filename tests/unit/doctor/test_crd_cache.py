"""Schemas without flags: the CRD cache, one download from the upstream release, the cluster.

The upstream release is played by a real HTTP server on 127.0.0.1 (FLEETSERVE_CRD_MIRROR points
the downloader at it) serving ../shared/k8s/crds' files; the cluster by a ``kubectl`` script that
answers as kubectl does. The manifests are ours: the three real bugs of issue #11 (a v1alpha1
RayService with the dropped ``spec.serveConfig``, a misplaced ``template.schedulerName``, a
non-string nodeSelector value).
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from fleetserve.cli import main
from fleetserve.k8s.doctor.command import diagnose
from fleetserve.k8s.doctor.crds import (
    KUBERAY,
    MIRROR_ENV,
    OFFLINE_ENV,
    CacheLookup,
    DownloadError,
    named_versions,
)
from fleetserve.k8s.doctor.loader import load_text
from fleetserve.modelstore.store import CACHE_ENV

from .conftest import CRDS

BUGS = """\
apiVersion: ray.io/v1alpha1
kind: RayService
metadata:
  name: legacy
spec:
  serveConfig:
    importPath: app:deployment
  rayClusterConfig:
    rayVersion: "2.9.0"
    headGroupSpec:
      rayStartParams: {}
      template:
        schedulerName: volcano
        spec:
          nodeSelector:
            gpu: true
          containers:
          - name: ray-head
            image: rayproject/ray:2.9.0
"""

NEAR_MISS = BUGS.replace("ray.io/v1alpha1", "ray.io/v1").replace(
    "  serveConfig:\n    importPath: app:deployment\n", "  serveConfigV2: 'applications: []'\n"
)
NEAR_MISS = NEAR_MISS.replace("        schedulerName: volcano\n", "").replace(
    "gpu: true", 'gpu: "true"'
)

OPERATOR_16 = """\
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: kuberay-operator
spec:
  selector: {matchLabels: {app: kuberay}}
  template:
    metadata: {labels: {app: kuberay}}
    spec:
      containers:
      - name: operator
        image: quay.io/kuberay/operator:v1.6.0
"""

pytestmark = pytest.mark.skipif(not CRDS.is_dir(), reason=f"CRDs not found at {CRDS}")


def _write(tmp_path: Path, text: str, name: str = "app.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _schema_paths(path: Path, *args: str) -> set[str]:
    result = diagnose([str(path)], rules={"schema"}, crds=args[0] if args else None)
    return {f.path for f in result.findings if f.rule == "schema"}


EXPECTED = {
    "spec.serveConfig",
    "spec.rayClusterConfig.headGroupSpec.template.schedulerName",
    "spec.rayClusterConfig.headGroupSpec.template.spec.nodeSelector.gpu",
}


def test_real_bugs_are_found_without_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, BUGS)
    assert main(["doctor", str(path), "--rules", "schema", "--format", "json"]) == 1
    found = {f["path"]: f for f in json.loads(capsys.readouterr().out)}
    assert set(found) == EXPECTED
    assert "did you mean 'serveConfigV2'" in found["spec.serveConfig"]["fix"]
    assert (
        found["spec.rayClusterConfig.headGroupSpec.template.spec.nodeSelector.gpu"]["fix"]
        == 'Quote it: "true".'
    )


def test_near_miss_is_clean_and_has_no_note(tmp_path: Path) -> None:
    result = diagnose([str(_write(tmp_path, NEAR_MISS))], rules={"schema"})
    assert result.findings == []
    assert result.notes == ()


def test_no_schema_gives_one_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty-cache"))
    path = _write(tmp_path, BUGS + OPERATOR_16.replace("v1.6.0", "v1.6.0") + _MONITOR)
    result = diagnose([str(path)], rules={"schema"})
    # KubeRay's schemas ship with fleetserve (the newest release, for 1.6.0's want of a cached
    # copy); prometheus-operator's do not.
    assert {f.path for f in result.findings} == EXPECTED
    [note] = result.notes
    assert "no CRD schema for prometheus-operator 0.93.0 ServiceMonitor" in note
    assert f"offline: {OFFLINE_ENV} is set" in note
    assert "--crds DIR" in note
    assert "--crds cluster" in note
    assert not (tmp_path / "empty-cache").exists(), "an offline run must not write the cache"


def test_machine_formats_put_the_note_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty-cache"))
    path = _write(tmp_path, BUGS + _MONITOR)
    for fmt in ("json", "sarif", "github"):
        assert main(["doctor", str(path), "--rules", "schema", "--format", fmt]) == 1
        out, err = capsys.readouterr()
        if fmt != "github":
            json.loads(out)
        assert err.count("note: no CRD schema for prometheus-operator") == 1


_MONITOR = """\
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: m}
spec:
  selector: {}
  endpoints: [{port: metrics, intervall: 5s}]
"""


def test_monitors_are_validated_too(tmp_path: Path) -> None:
    paths = _schema_paths(_write(tmp_path, _MONITOR))
    assert paths == {"spec.endpoints[0].intervall"}


# --------------------------------------------------------------------------------------------
# Download once from the upstream release (a real HTTP server on 127.0.0.1)
# --------------------------------------------------------------------------------------------


class Release:
    """Serves ``/<repo>/v<version>/<folder>/<file>`` from ../shared/k8s/crds, counting hits."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.status = 200
        self.body: bytes | None = None
        release = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                release.hits.append(self.path)
                name = self.path.rsplit("/", 1)[-1]
                data = release.body if release.body is not None else None
                if data is None and (CRDS / name).is_file():
                    data = (CRDS / name).read_bytes()
                status = release.status if data is not None else 404
                body = data if status == 200 and data else b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                del format, args

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def mirror(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/{{repo}}/v{{version}}/{{path}}"


@pytest.fixture
def release(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Release]:
    r = Release()
    monkeypatch.setenv(MIRROR_ENV, r.mirror)
    monkeypatch.delenv(OFFLINE_ENV)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    yield r
    r.server.shutdown()
    r.server.server_close()


def test_downloads_the_named_version_once(tmp_path: Path, release: Release) -> None:
    path = _write(tmp_path, BUGS + OPERATOR_16)
    assert _schema_paths(path) == EXPECTED
    assert release.hits == [
        "/ray-project/kuberay/v1.6.0/helm-chart/kuberay-operator/crds/ray.io_rayservices.yaml"
    ]
    cached = tmp_path / "cache" / "crds" / "kuberay" / "1.6.0" / "ray.io_rayservices.yaml"
    assert cached.read_bytes() == (CRDS / "ray.io_rayservices.yaml").read_bytes()
    # Second run: from the cache, even with the release gone.
    release.status = 500
    result = diagnose([str(path)], rules={"schema"})
    assert {f.path for f in result.findings} == EXPECTED
    assert result.notes == ()
    assert len(release.hits) == 1


def test_no_named_version_downloads_the_newest_known(tmp_path: Path, release: Release) -> None:
    assert _schema_paths(_write(tmp_path, BUGS)) == EXPECTED
    assert [h.split("/")[3] for h in release.hits] == [f"v{KUBERAY.newest}"]


def test_failed_download_is_one_note_and_not_retried_soon(tmp_path: Path, release: Release) -> None:
    release.status = 503
    path = _write(tmp_path, BUGS + _MONITOR)
    result = diagnose([str(path)], rules={"schema"})
    [note] = result.notes
    assert "download failed: HTTP 503" in note
    assert len(release.hits) == 1, "after one network failure the run stops downloading"
    release.status = 200
    again = diagnose([str(path)], rules={"schema"})
    assert "failed less than 10 minutes ago" in again.notes[0]
    assert len(release.hits) == 1


def test_release_without_the_file_is_not_an_error(tmp_path: Path, release: Release) -> None:
    text = BUGS.replace("kind: RayService", "kind: RayCronJob").replace("v1alpha1", "v1")
    result = diagnose([str(_write(tmp_path, text))], rules={"schema"})
    # The (played) release has no RayCronJob file: a 404, not a network failure. The newest
    # release shipped with fleetserve that has the kind (1.6.2) checks it instead.
    assert not (tmp_path / "cache" / "crds" / ".download-failed").exists()
    assert result.notes == ()
    assert {f.path for f in result.findings} >= {"spec.serveConfig"}


def test_something_else_than_a_crd_is_not_cached(tmp_path: Path, release: Release) -> None:
    release.body = b"<html>sign in to the wifi</html>"
    result = diagnose([str(_write(tmp_path, BUGS + _MONITOR))], rules={"schema"})
    # KubeRay: the schemas shipped with fleetserve; prometheus-operator: none.
    assert {f.path for f in result.findings} == EXPECTED
    assert "no CRD schema for prometheus-operator" in result.notes[0]
    assert not list((tmp_path / "cache").rglob("*.yaml"))


def test_named_version_missing_offline_falls_back_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The autouse offline cache holds 1.7.0 only; the input names 1.6.0: the 1.6 release
    # shipped with fleetserve (same minor, patch releases keep their CRDs) is closer.
    result = diagnose([str(_write(tmp_path, BUGS + OPERATOR_16))], rules={"schema"})
    assert {f.path for f in result.findings} == EXPECTED
    [note] = result.notes
    assert "the KubeRay 1.6.2 (shipped with fleetserve) CRDs, not 1.6.0 as the input names" in note


def test_versions_named_by_helm_values_and_images() -> None:
    values = "image: {repository: quay.io/kuberay/operator, tag: v1.5.2}\nfeatureGates: []\n"
    inv = load_text(OPERATOR_16 + "---\n" + values)
    assert named_versions(inv, KUBERAY) == {"1.6.0", "1.5.2"}


def test_downloader_seam_failure_stops_the_run(tmp_path: Path) -> None:
    class Down:
        calls = 0

        def get(self, url: str) -> bytes | None:
            Down.calls += 1
            raise DownloadError("no route to host")

    text = BUGS + BUGS.replace("kind: RayService", "kind: RayCluster").replace("v1alpha1", "v1")
    found = CacheLookup(tmp_path, Down()).lookup(load_text(text))
    assert Down.calls == 1
    assert "no route to host" in found.reason
    # The release fleetserve ships answers for both kinds: nothing is missing.
    assert found.used == ["KubeRay 1.7.0 (shipped with fleetserve)"]
    assert found.note() is None


# --------------------------------------------------------------------------------------------
# --crds cluster (kubectl)
# --------------------------------------------------------------------------------------------


def _fake_kubectl(bin_dir: Path, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "kubectl"
    exe.write_text("#!/bin/sh\n" + script, encoding="utf-8")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH has a kubectl that prints the CRDs as ``kubectl get crd -o json``; KUBECONFIG set."""
    items = [
        yaml.safe_load((CRDS / name).read_text(encoding="utf-8"))
        for name in ("ray.io_rayservices.yaml", "monitoring.coreos.com_servicemonitors.yaml")
    ]
    listing = tmp_path / "crds.json"
    listing.write_text(json.dumps({"kind": "List", "items": items}), encoding="utf-8")
    _fake_kubectl(tmp_path / "bin", f'[ "$2" = customresourcedefinitions ] && cat "{listing}"\n')
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n", encoding="utf-8")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty"))  # the cluster, not the cache
    return tmp_path


def test_crds_from_the_cluster(cluster: Path) -> None:
    path = _write(cluster, BUGS + _MONITOR)
    assert _schema_paths(path, "cluster") == EXPECTED | {"spec.endpoints[0].intervall"}


def test_cluster_without_kubeconfig_is_a_clear_error(
    cluster: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster / "nope"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["doctor", str(_write(cluster, BUGS)), "--crds", "cluster"]) == 2
    err = capsys.readouterr().err
    assert "--crds cluster: no kubeconfig" in err
    assert "Traceback" not in err


def test_cluster_unreachable_is_a_clear_error(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_kubectl(
        cluster / "bin",
        'echo "The connection to the server 10.0.0.1:6443 was refused" >&2\nexit 1\n',
    )
    assert main(["doctor", str(_write(cluster, BUGS)), "--crds", "cluster"]) == 2
    err = capsys.readouterr().err
    assert "kubectl get customresourcedefinitions failed" in err
    assert "connection to the server 10.0.0.1:6443 was refused" in err


def test_cluster_without_kubectl_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    assert main(["doctor", str(_write(tmp_path, BUGS)), "--crds", "cluster"]) == 2
    assert "kubectl is not on PATH" in capsys.readouterr().err


def test_crds_dir_still_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty"))
    assert _schema_paths(_write(tmp_path, BUGS), str(CRDS)) == EXPECTED


def test_parsed_crds_are_kept_as_json_and_refreshed_when_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "cache" / "crds" / "kuberay" / "1.7.0"
    folder.mkdir(parents=True)
    crd = folder / "ray.io_rayservices.yaml"
    crd.write_bytes((CRDS / "ray.io_rayservices.yaml").read_bytes())
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = _write(tmp_path, BUGS)
    assert _schema_paths(path) == EXPECTED
    side = folder / ".ray.io_rayservices.yaml.json"
    assert json.loads(side.read_text(encoding="utf-8"))["docs"][0]["spec"]["names"]["kind"] == (
        "RayService"
    )
    # The CRD changes (a newer download): the JSON is stale and must not be used.
    text = crd.read_text(encoding="utf-8").replace("served: true", "served: false")
    crd.write_text(text, encoding="utf-8")
    assert _schema_paths(path) == {"apiVersion"}  # no version served any more
