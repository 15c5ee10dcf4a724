"""Which Ray and vLLM a manifest runs, read from what it writes, and the version facts rules use.

Design note: a rule whose truth depends on a version (a Serve field renamed in Ray 2.10 and
dropped in 2.33, Ray Train v2 becoming the default in 2.51, token authentication from 2.52)
reads the version here, once, from the manifest itself: the cluster's ``rayVersion``, else the
Ray version in a Ray image's tag (``rayproject/ray:2.9.0-py310-gpu``, ``ray-ml``, ``ray-llm``);
vLLM's from a vLLM image tag (``vllm/vllm-openai:v0.6.3``). A rule then says which version it
assumed (``Ray 2.9.0 (rayVersion)``), and with no version it uses wording true for every
version instead of guessing. Each boundary below was checked in the released wheels/sources,
so it lives here and nowhere else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from fleetserve.k8s.doctor.crds import KUBERAY, named_version_sources
from fleetserve.k8s.doctor.inventory import Inventory, Manifest
from fleetserve.k8s.doctor.ray_objects import cluster_spec, groups

#: Ray 2.10 added ``max_ongoing_requests`` / ``target_ongoing_requests`` and deprecated
#: ``max_concurrent_queries`` / ``target_num_ongoing_requests_per_replica`` (ray.serve.schema
#: and ray.serve.config of the 2.10.0 wheel); before it the old names are the only ones.
SERVE_NEW_NAMES_FROM = Version("2.10")
#: Ray 2.33 removed the old names (ray#46427, ray#46392); DeploymentSchema and
#: AutoscalingConfig ignore unknown keys, so from then on they are dropped without an error.
SERVE_OLD_NAMES_DROPPED_FROM = Version("2.33")
#: Serve's defaults from Ray 2.32 on (``DEFAULT_MAX_ONGOING_REQUESTS = 5``,
#: ``DEFAULT_TARGET_ONGOING_REQUESTS = 2`` in ray/serve/_private/constants.py); 2.9-2.10 had
#: 100 and 1.
SERVE_DEFAULT_MAX_ONGOING = 5
SERVE_DEFAULT_TARGET_ONGOING = 2.0
SERVE_DEFAULTS_5_FROM = Version("2.32")
#: ``max_ongoing_requests`` (``max_concurrent_queries`` before 2.10) when not written, before
#: :data:`SERVE_DEFAULTS_5_FROM`.
SERVE_PRE_2_32_MAX_ONGOING = 100
#: Ray Train v2 is the default from Ray 2.51 (``is_v2_enabled()`` reads RAY_TRAIN_V2_ENABLED
#: with default False in 2.50.1, True in 2.51.0; ray#57857).
TRAIN_V2_DEFAULT_FROM = Version("2.51")
#: Ray's token authentication (RAY_AUTH_MODE=token) exists from Ray 2.52.0.
TOKEN_AUTH_FROM = Version("2.52")

#: HAMi's admission webhook denies a GPU pod with a privileged container from v2.10.0; before
#: it skipped such containers (no slice limits, no hami-scheduler) and admitted the pod
#: (pkg/scheduler/webhook.go at v2.9.0 vs v2.10.0).
HAMI_DENIES_PRIVILEGED_FROM = Version("2.10")

#: KubeRay refuses a RayService that names its head Service from v1.3.0
#: (ValidateRayServiceSpec in ray-operator/controllers/ray/utils/validation.go; absent in v1.2.x).
KUBERAY_REJECTS_HEAD_SERVICE_NAME_FROM = Version("1.3")
#: KubeRay probes a RayService worker's Serve proxy on its `serve` port from 1.1 (PR #1808).
KUBERAY_PROBES_SERVE_PORT_FROM = Version("1.1")

_LEADING = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class KnownVersion:
    """A component's version as read from a manifest, and where it was read."""

    #: ``Ray`` or ``vLLM``.
    component: str
    version: Version
    #: Where it was read, e.g. ``rayVersion`` or ``image rayproject/ray:2.9.0-py310``.
    source: str

    def at_least(self, boundary: Version) -> bool:
        """``version >= boundary``."""
        return self.version >= boundary

    def describe(self) -> str:
        """``Ray 2.9.0 (rayVersion)`` for messages."""
        return f"{self.component} {self.version} ({self.source})"


def normalise(text: str) -> Version | None:
    """``"2.9"``, ``"v2.9.0"``, ``"2.9.0-py310"`` -> Version("2.9.0"); None when no version."""
    found = _LEADING.match(text.strip())
    if not found:
        return None
    parts = [found.group(1), found.group(2), found.group(3) or "0"]
    try:
        return Version(".".join(str(int(p)) for p in parts))
    except InvalidVersion:
        return None


def ray_version_of_image(image: str) -> str | None:
    """The Ray version an image carries, when its name says so; None for other images.

    ``rayproject/ray:2.35.0-py311-cu121`` -> 2.35.0 (also ray-ml, ray-llm, anyscale/ray);
    ``.../ray2.24.0-py310-vllm-gpu:v1`` -> 2.24.0. A custom image's tag is not Ray's
    version, so ``my/llm:1.2.3`` gives None.
    """
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    name, _, tag = last.partition(":")
    embedded = re.match(r"^ray[-_]?v?(\d+\.\d+(?:\.\d+)?)(?:[-_.]|$)", name)
    if embedded:
        found = normalise(embedded.group(1))
        return str(found) if found else None
    if re.fullmatch(r"ray(-ml|-llm|-gpu|-cpu)?", name) and tag:
        found = normalise(tag)
        return str(found) if found else None
    return None


def vllm_version_of_image(image: str) -> str | None:
    """vLLM's version from a vLLM image tag: ``vllm/vllm-openai:v0.6.3`` -> 0.6.3, else None."""
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    name, _, tag = last.partition(":")
    if not name.startswith("vllm") or not tag:
        return None
    found = normalise(tag)
    return str(found) if found else None


def ray_version(m: Manifest) -> KnownVersion | None:
    """The Ray version a RayService/RayCluster/RayJob runs: ``rayVersion``, else its images."""
    found = cluster_spec(m)
    if found is not None:
        spec, _ = found
        declared = spec.get("rayVersion")
        if isinstance(declared, str | int | float) and not isinstance(declared, bool):
            parsed = normalise(str(declared))
            if parsed is not None:
                return KnownVersion("Ray", parsed, "rayVersion")
    for g in groups(m):
        image = g.container.get("image")
        if isinstance(image, str) and (text := ray_version_of_image(image)) is not None:
            return KnownVersion("Ray", Version(text), f"image {image}")
    return None


def vllm_version(images: list[str]) -> KnownVersion | None:
    """vLLM's version from the first vLLM image among ``images``."""
    for image in images:
        text = vllm_version_of_image(image)
        if text is not None:
            return KnownVersion("vLLM", Version(text), f"image {image}")
    return None


def hami_version(inv: Inventory) -> KnownVersion | None:
    """HAMi's version from its chart values (``global.imageTag``, older charts' ``version``)
    or a ``projecthami/hami`` image among the manifests."""
    for values in inv.charts("hami"):
        for key in ("global.imageTag", "version"):
            raw = values.get(key)
            parsed = normalise(str(raw)) if isinstance(raw, str | int | float) else None
            if parsed is not None:
                return KnownVersion("HAMi", parsed, f"{key} in {values.file}")
    for m in inv.manifests:
        for text in _images(m.body.get("spec")):
            name, _, tag = text.split("@", 1)[0].rpartition(":")
            if name.endswith("projecthami/hami") and (parsed := normalise(tag)) is not None:
                return KnownVersion("HAMi", parsed, f"image {text}")
    return None


def kuberay_version(inv: Inventory) -> KnownVersion | None:
    """The KubeRay operator's version as the input names it (operator image in a manifest or
    the kuberay-operator chart values; the newest when several), or None."""
    sources = named_version_sources(inv, KUBERAY)
    named = [(v, parsed) for v in sources if (parsed := normalise(v))]
    if not named:
        return None
    text, parsed = max(named, key=lambda vp: vp[1])
    return KnownVersion("KubeRay", parsed, sources[text])


def _images(node: object) -> list[str]:
    """Every ``image:`` string under ``node``."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "image" and isinstance(v, str):
                out.append(v)
            else:
                out.extend(_images(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(_images(v))
    return out
