"""fleetserve.k8s.render: fleet spec + plan -> KubeRay/HAMi/monitoring manifests (pure)."""

from fleetserve.k8s.render.options import RenderOptions
from fleetserve.k8s.render.renderer import render
from fleetserve.k8s.render.writer import manifest_files, write_manifests

__all__ = ["RenderOptions", "manifest_files", "render", "write_manifests"]
