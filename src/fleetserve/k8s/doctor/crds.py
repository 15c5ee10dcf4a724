"""Where custom-resource schemas come from, kubeconform-style: cache, upstream release, cluster.

Design note:
- The input decides what is needed: the (group, kind) of each custom resource whose upstream
  doctor knows (KubeRay for ``ray.io``, prometheus-operator for ``monitoring.coreos.com``).
  Each upstream publishes one CRD file per kind in its release. The version wanted is the one
  the manifests name (the operator's image tag in a Deployment or in the chart's Helm values),
  else the newest known: the newest release this module knows or the newest in the cache,
  whichever is newer.
- Default look-up: the cache (``<cache>/crds/<component>/<version>/<file>``, cache root as for
  models: ``$FLEETSERVE_CACHE`` else ``~/.cache/fleetserve``), else one download from the
  upstream release (a short timeout), written to the cache only after it parsed as the CRD it
  is named for, so every later run is offline. A failed download (no network) stops all others
  in the run and is remembered for ``_RETRY_AFTER_S`` so offline runs stay fast;
  ``FLEETSERVE_OFFLINE=1`` never downloads. When the wanted version cannot be had from the
  cache or the release, the schemas shipped with fleetserve for it (``bundled.py``) are used,
  else the newest cached version that has the file, else the newest shipped release. Whatever
  could not be had becomes ONE note.
- ``--crds cluster`` reads the installed CRDs with kubectl (the user's kubeconfig and context):
  they are what the API server validates against. Anything that stops it is a usage error that
  says what is missing (exit 2), never a silent fallback.
- ``--crds DIR``: a directory of CRD files, as before.
What must stay true: nothing is downloaded for an input without custom resources of a known
upstream, nor with ``FLEETSERVE_OFFLINE`` set; the cache only holds parsed, matching CRDs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import httpx
import yaml
from packaging.version import InvalidVersion, Version

from fleetserve.errors import UsageError
from fleetserve.k8s.doctor.bundled import bundled, bundled_versions, crd_documents
from fleetserve.k8s.doctor.inventory import Inventory, Manifest
from fleetserve.k8s.doctor.schema import CrdSchemas

#: ``--crds`` value that reads the CRDs installed in the cluster of the current kubeconfig.
CLUSTER = "cluster"
#: Set (to anything but "" or "0") to never download schemas.
OFFLINE_ENV = "FLEETSERVE_OFFLINE"
#: Overrides where releases are downloaded from (a mirror): a URL template with ``{repo}``,
#: ``{version}`` and ``{path}``.
MIRROR_ENV = "FLEETSERVE_CRD_MIRROR"
_DEFAULT_MIRROR = "https://raw.githubusercontent.com/{repo}/v{version}/{path}"
#: After a download failed for want of a network, how long runs do not try again (seconds).
_RETRY_AFTER_S = 600
_FAILED_STAMP = ".download-failed"
#: Connect / read timeouts of one download (seconds): short, a user is waiting.
_CONNECT_TIMEOUT_S = 3.0
_READ_TIMEOUT_S = 15.0


@dataclass(frozen=True, eq=False)  # identity: one object per upstream, usable as a key
class Upstream:
    """A project that publishes CRDs: where its release keeps one file per kind."""

    #: Cache directory name, e.g. ``kuberay``.
    component: str
    #: How messages name it.
    title: str
    #: API group of its custom resources.
    group: str
    #: The newest release this module knows (X.Y.Z).
    newest: str
    #: ``owner/name`` on GitHub and the folder holding the CRD files in a release.
    repo: str
    folder: str
    #: kind -> CRD file name in ``folder``.
    files: Mapping[str, str]
    #: Matches the operator's container image; group 1 is the version.
    image: re.Pattern[str]

    def url(self, version: str, kind: str) -> str:
        template = os.environ.get(MIRROR_ENV) or _DEFAULT_MIRROR
        path = f"{self.folder}/{self.files[kind]}"
        return template.format(repo=self.repo, version=version, path=path)


KUBERAY = Upstream(
    component="kuberay",
    title="KubeRay",
    group="ray.io",
    newest="1.7.0",
    repo="ray-project/kuberay",
    folder="helm-chart/kuberay-operator/crds",
    files={
        "RayCluster": "ray.io_rayclusters.yaml",
        "RayJob": "ray.io_rayjobs.yaml",
        "RayService": "ray.io_rayservices.yaml",
        "RayCronJob": "ray.io_raycronjobs.yaml",
    },
    image=re.compile(r"(?:^|/)kuberay/operator:v?(\d+\.\d+\.\d+)"),
)
PROMETHEUS_OPERATOR = Upstream(
    component="prometheus-operator",
    title="prometheus-operator",
    group="monitoring.coreos.com",
    newest="0.93.0",
    repo="prometheus-operator/prometheus-operator",
    folder="example/prometheus-operator-crd",
    files={
        kind: f"monitoring.coreos.com_{plural}.yaml"
        for kind, plural in (
            ("ServiceMonitor", "servicemonitors"),
            ("PodMonitor", "podmonitors"),
            ("PrometheusRule", "prometheusrules"),
            ("Prometheus", "prometheuses"),
            ("PrometheusAgent", "prometheusagents"),
            ("Probe", "probes"),
            ("ScrapeConfig", "scrapeconfigs"),
            ("Alertmanager", "alertmanagers"),
            ("AlertmanagerConfig", "alertmanagerconfigs"),
            ("ThanosRuler", "thanosrulers"),
        )
    },
    image=re.compile(r"(?:^|/)prometheus-operator/prometheus-operator:v?(\d+\.\d+\.\d+)"),
)
UPSTREAMS: tuple[Upstream, ...] = (KUBERAY, PROMETHEUS_OPERATOR)


class DownloadError(Exception):
    """The network failed (not: the file does not exist)."""


class Downloader(Protocol):
    """Fetches one URL. None when it does not exist (HTTP 404); DownloadError when the
    network fails (no route, DNS, timeout, a 5xx)."""

    def get(self, url: str) -> bytes | None: ...


@dataclass
class HttpDownloader:
    """httpx with short timeouts; honours the usual proxy variables."""

    connect_timeout_s: float = _CONNECT_TIMEOUT_S
    read_timeout_s: float = _READ_TIMEOUT_S

    def get(self, url: str) -> bytes | None:
        timeout = httpx.Timeout(self.read_timeout_s, connect=self.connect_timeout_s)
        try:
            r = httpx.get(url, timeout=timeout, follow_redirects=True)
        except httpx.HTTPError as e:
            raise DownloadError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from e
        if r.status_code == 404:
            return None
        if r.status_code >= 400:
            raise DownloadError(f"HTTP {r.status_code} from {url}")
        return r.content


def offline() -> bool:
    """Whether ``FLEETSERVE_OFFLINE`` forbids downloads."""
    return os.environ.get(OFFLINE_ENV, "") not in ("", "0")


def crd_cache_dir() -> Path:
    """``<cache root>/crds`` (the cache root is the one models use)."""
    # The one cache root; imported here because modelstore pulls in the model tooling.
    from fleetserve.modelstore.store import cache_root  # noqa: PLC0415

    return cache_root() / "crds"


# --------------------------------------------------------------------------------------------
# What the input needs, and which version
# --------------------------------------------------------------------------------------------


def needed_kinds(inv: Inventory) -> dict[Upstream, set[str]]:
    """Upstream -> kinds of its custom resources in the input (no CRD among the inputs)."""
    inline = {
        (str((m.body.get("spec") or {}).get("group", "")), _crd_kind(m.body))
        for m in inv.of_kind("CustomResourceDefinition")
    }
    out: dict[Upstream, set[str]] = {}
    for m in inv.manifests:
        up = known_upstream(m)
        if up is not None and (up.group, m.kind) not in inline:
            out.setdefault(up, set()).add(m.kind)
    return out


def known_upstream(m: Manifest) -> Upstream | None:
    """The upstream that publishes the CRD of ``m``'s kind, if doctor knows one."""
    group = m.api_version.rpartition("/")[0]
    return next((up for up in UPSTREAMS if up.group == group and m.kind in up.files), None)


def _crd_kind(body: dict[str, Any]) -> str:
    spec = body.get("spec")
    names = spec.get("names") if isinstance(spec, dict) else None
    return str(names.get("kind", "")) if isinstance(names, dict) else ""


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def named_versions(inv: Inventory, up: Upstream) -> set[str]:
    """Versions of ``up`` the input names: its operator image in any manifest, or the
    ``image.repository``/``image.tag`` pair of a Helm values document."""
    return set(named_version_sources(inv, up))


def named_version_sources(inv: Inventory, up: Upstream) -> dict[str, str]:
    """Each version of ``up`` the input names -> where (the first file that names it), so a
    message can say which file supplied the version it reasons from."""
    found: dict[str, str] = {}
    for m in inv.manifests:
        for text in _strings(m.body.get("spec")):
            hit = up.image.search(text)
            if hit:
                found.setdefault(hit.group(1), f"operator image {text} in {m.file}")
    for h in inv.helm_values:
        image = h.body.get("image")
        if isinstance(image, dict) and image.get("tag") is not None:
            hit = up.image.search(f"{image.get('repository', '')}:{image['tag']}")
            if hit:
                found.setdefault(hit.group(1), f"image.tag {image['tag']} in {h.file}")
    return found


def _version_key(v: str) -> Version:
    try:
        return Version(v)
    except InvalidVersion:
        return Version("0")


def cached_versions(cache: Path, up: Upstream) -> list[str]:
    """Versions with a directory in the cache, oldest first."""
    root = cache / up.component
    if not root.is_dir():
        return []
    return sorted((p.name for p in root.iterdir() if p.is_dir()), key=_version_key)


# --------------------------------------------------------------------------------------------
# The default look-up: cache, then one download
# --------------------------------------------------------------------------------------------


@dataclass
class CrdLookup:
    """CRD schemas for one run, and what could not be had (for the one note)."""

    schemas: CrdSchemas = field(default_factory=CrdSchemas)
    #: "KubeRay 1.7.0" -> kinds whose CRD was wanted but not found.
    missing: dict[str, list[str]] = field(default_factory=dict)
    #: "KubeRay 1.5.0 (used 1.7.0)": versions the manifests name that could not be had.
    substituted: list[str] = field(default_factory=list)
    #: Why downloads did not happen or failed ("" when they were not needed).
    reason: str = ""
    #: "KubeRay 1.7.0 from the cache"-style entries: what validated the input.
    used: list[str] = field(default_factory=list)

    def note(self) -> str | None:
        """The one note for the report, or None when every schema was found."""
        if not self.missing and not self.substituted:
            return None
        why = f" ({self.reason})" if self.reason else ""
        hint = "pass --crds DIR (CRD files) or --crds cluster (read them with kubectl)"
        if not self.missing:
            return (
                f"custom resources validated with {', '.join(self.substituted)}{why}; for the "
                f"exact schemas {hint}"
            )
        what = "; ".join(f"{k} {', '.join(kinds)}" for k, kinds in self.missing.items())
        return (
            f"no CRD schema for {what}{why}: those custom resources are not schema-checked; " + hint
        )


def _is_crd_of(docs: list[dict[str, Any]], up: Upstream, kind: str) -> bool:
    return any(
        str((d.get("spec") or {}).get("group")) == up.group and _crd_kind(d) == kind for d in docs
    )


def _cached_docs(path: Path) -> list[dict[str, Any]]:
    """The CRD documents of a cached file. Parsing a KubeRay CRD's YAML takes most of a
    second, so the parsed documents are kept beside it as JSON (``.<name>.json``, keyed by the
    YAML's size and mtime) and later runs load that instead (~50x faster)."""
    stat = path.stat()
    return list(_cached_docs_at(str(path), stat.st_size, stat.st_mtime_ns))


@lru_cache(maxsize=32)
def _cached_docs_at(file: str, size: int, mtime_ns: int) -> tuple[dict[str, Any], ...]:
    path = Path(file)
    side = path.with_name(f".{path.name}.json")
    key = [size, mtime_ns]
    try:
        saved = json.loads(side.read_bytes())
        if saved.get("source") == key and isinstance(saved.get("docs"), list):
            return tuple(d for d in saved["docs"] if isinstance(d, dict))
    except (OSError, ValueError, AttributeError):
        pass
    docs = _crd_docs(path.read_bytes())
    with contextlib.suppress(OSError):  # a read-only cache still works, only slower
        _write_atomic(side, json.dumps({"source": key, "docs": docs}).encode())
    return tuple(docs)


def _crd_docs(data: bytes) -> list[dict[str, Any]]:
    try:
        docs = list(yaml.load_all(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    except yaml.YAMLError:
        return []
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"]


def _write_atomic(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".part-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _bundled_docs(up: Upstream, version: str, kind: str) -> list[dict[str, Any]]:
    """The CRD documents of ``kind`` shipped with fleetserve for ``version`` ([] if none)."""
    facts = bundled(up.component, version)
    docs = crd_documents(facts) if facts is not None else []
    return [d for d in docs if _is_crd_of([d], up, kind)]


@dataclass
class CacheLookup:
    """Default mode: cache first, then the upstream release (once), never the cluster."""

    cache: Path
    downloader: Downloader | None = None
    #: False: never download (``FLEETSERVE_OFFLINE``).
    online: bool = True
    _failed: str = ""

    def _recently_failed(self) -> bool:
        stamp = self.cache / _FAILED_STAMP
        try:
            return time.time() - stamp.stat().st_mtime < _RETRY_AFTER_S
        except OSError:
            return False

    def _download(self, up: Upstream, version: str, kind: str) -> Path | None:
        """Download one CRD file into the cache; None when not possible (reason recorded)."""
        if not self.online:
            self._failed = self._failed or f"offline: {OFFLINE_ENV} is set"
            return None
        if self._failed:
            return None
        if self._recently_failed():
            self._failed = (
                f"not in the cache {self.cache}; a download failed less than "
                f"{_RETRY_AFTER_S // 60} minutes ago"
            )
            return None
        url = up.url(version, kind)
        try:
            data = (self.downloader or HttpDownloader()).get(url)
        except DownloadError as e:
            self._failed = f"not in the cache {self.cache} and the download failed: {e}"
            try:
                self.cache.mkdir(parents=True, exist_ok=True)
                (self.cache / _FAILED_STAMP).touch()
            except OSError:
                pass
            return None
        if data is None:
            return None  # this release has no such file (e.g. RayCronJob before KubeRay 1.6)
        if not _is_crd_of(_crd_docs(data), up, kind):
            return None  # not the CRD it should be (a captive portal, a moved file)
        target = self.cache / up.component / version / up.files[kind]
        try:
            _write_atomic(target, data)
        except OSError as e:
            self._failed = f"cannot write the cache {self.cache}: {e}"
            return None
        return target

    def _file(self, up: Upstream, version: str, kind: str) -> Path | None:
        path = self.cache / up.component / version / up.files[kind]
        if path.is_file() and _is_crd_of(_cached_docs(path), up, kind):
            return path
        return self._download(up, version, kind)

    @staticmethod
    def _fallbacks(
        wanted: str, cached: list[str], shipped: list[str]
    ) -> Iterator[tuple[str, bool]]:
        """(version, from the package) to try, in order, when ``wanted`` is neither cached nor
        downloadable: the same release shipped with fleetserve, then the newest shipped patch of
        the same minor (patch releases keep their CRDs), then the newest cached release, then
        the newest shipped one."""
        minor = _version_key(wanted).release[:2]
        if wanted in shipped:
            yield wanted, True
        for v in reversed(shipped):
            if v != wanted and _version_key(v).release[:2] == minor:
                yield v, True
        for v in reversed(cached):
            if v != wanted:
                yield v, False
        for v in reversed(shipped):
            yield v, True

    def lookup(self, inv: Inventory) -> CrdLookup:
        out = CrdLookup()
        for up, kinds in sorted(needed_kinds(inv).items(), key=lambda kv: kv[0].component):
            named = sorted(named_versions(inv, up), key=_version_key)
            cached = cached_versions(self.cache, up)
            wanted = named[-1] if named else max([up.newest, *cached], key=_version_key)
            shipped = sorted(bundled_versions(up.component), key=_version_key)
            for kind in sorted(kinds):
                path = self._file(up, wanted, kind)
                used, shipped_used = wanted, False
                docs = _cached_docs(path) if path is not None else []
                for version, from_package in self._fallbacks(wanted, cached, shipped):
                    if docs:
                        break
                    if from_package:
                        docs = _bundled_docs(up, version, kind)
                    else:
                        candidate = self.cache / up.component / version / up.files[kind]
                        if candidate.is_file() and _is_crd_of(_cached_docs(candidate), up, kind):
                            docs = _cached_docs(candidate)
                    used, shipped_used = version, from_package
                if not docs:
                    out.missing.setdefault(f"{up.title} {wanted}", []).append(kind)
                    continue
                for doc in docs:
                    out.schemas.add_crd(doc)
                label = f"{up.title} {used}" + (
                    " (shipped with fleetserve)" if shipped_used else ""
                )
                if label not in out.used:
                    out.used.append(label)
                swap = f"the {label} CRDs, not {wanted} as the input names"
                if used != wanted and named and swap not in out.substituted:
                    out.substituted.append(swap)
        out.reason = self._failed
        return out


# --------------------------------------------------------------------------------------------
# --crds cluster
# --------------------------------------------------------------------------------------------


def _kubeconfig_present() -> bool:
    env = os.environ.get("KUBECONFIG")
    if env:
        return any(Path(p).expanduser().is_file() for p in env.split(os.pathsep) if p)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return True  # in a pod: kubectl uses the service account
    return (Path.home() / ".kube" / "config").is_file()


@dataclass
class KubectlCrds:
    """Reads the cluster's CRDs with ``kubectl get customresourcedefinitions -o json``."""

    kubectl: str = "kubectl"
    timeout_s: float = 30.0

    def load(self) -> CrdSchemas:
        exe = shutil.which(self.kubectl)
        if exe is None:
            raise UsageError(
                f"--crds cluster: {self.kubectl} is not on PATH (it reads the CRDs from the "
                "cluster)",
                hint="install kubectl, or pass --crds DIR with the CRD files",
            )
        if not _kubeconfig_present():
            raise UsageError(
                "--crds cluster: no kubeconfig (KUBECONFIG is unset or names no file, and "
                "~/.kube/config does not exist)",
                hint="point KUBECONFIG at the cluster's config, or pass --crds DIR",
            )
        cmd = [exe, "get", "customresourcedefinitions", "-o", "json", "--request-timeout=10s"]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except subprocess.TimeoutExpired as e:
            raise UsageError(
                f"--crds cluster: kubectl did not answer in {self.timeout_s:.0f} s"
            ) from e
        if proc.returncode != 0:
            first = (proc.stderr or proc.stdout).strip().splitlines()
            raise UsageError(
                "--crds cluster: kubectl get customresourcedefinitions failed: "
                + (first[0] if first else f"exit {proc.returncode}"),
                hint="check the kubeconfig's current context, or pass --crds DIR",
            )
        try:
            items = json.loads(proc.stdout).get("items") or []
        except (json.JSONDecodeError, AttributeError) as e:
            raise UsageError("--crds cluster: kubectl printed no CRD list") from e
        schemas = CrdSchemas()
        for item in items:
            if isinstance(item, dict):
                schemas.add_crd(item)
        return schemas


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def lookup_crds(
    inv: Inventory,
    crds: str | None,
    *,
    cache: Path | None = None,
    downloader: Downloader | None = None,
    kubectl: str = "kubectl",
) -> CrdLookup:
    """CRD schemas for ``inv`` from ``--crds`` (None: cache/upstream, ``cluster``, or DIR)."""
    if crds == CLUSTER:
        return CrdLookup(KubectlCrds(kubectl).load(), used=["the cluster's CRDs (kubectl)"])
    if crds is not None:
        if not Path(crds).is_dir():
            raise UsageError(
                f"--crds {crds}: not a directory",
                hint="pass a directory of CRD YAML files, or --crds cluster",
            )
        wanted = {(m.api_version.rpartition("/")[0], m.kind) for m in inv.manifests}
        return CrdLookup(CrdSchemas.from_dir(crds, wanted), used=[f"CRDs from {crds}"])
    if not needed_kinds(inv):
        return CrdLookup()
    finder = CacheLookup(cache or crd_cache_dir(), downloader, online=not offline())
    return finder.lookup(inv)
