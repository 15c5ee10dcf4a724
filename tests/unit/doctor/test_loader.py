"""The loader: YAML with lines, kind-less documents, fleet specs, Python read from the AST."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from fleetserve.errors import InputFileError
from fleetserve.k8s.doctor.loader import expand_paths, load_paths, load_python_text, load_text

MULTI = """\
# leading comment
apiVersion: v1
kind: Namespace
metadata:
  name: serving
---
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: ConfigMap
    metadata:
      name: a
      namespace: serving
    data:
      k: v
  - apiVersion: v1
    kind: Secret
    metadata:
      name: b
---
scheduler:
  kubeScheduler:
    enabled: false
devicePlugin:
  deviceMemoryScaling: 1.0
---
"""


def test_multi_document_lines_and_list_expansion() -> None:
    inv = load_text(MULTI, "x.yaml")
    refs = [(m.ref, m.line) for m in inv.manifests]
    assert refs == [
        ("Namespace/default/serving", 2),
        ("ConfigMap/serving/a", 10),
        ("Secret/default/b", 17),
    ]
    cm = inv.manifests[1]
    assert cm.line_of("data.k") == 16
    assert cm.line_of("data.missing.deeper") == 15  # nearest recorded ancestor
    assert cm.line_of("nothing") == cm.line


def test_helm_values_detected() -> None:
    inv = load_text(MULTI, "values.yaml")
    [hv] = inv.helm_values
    assert hv.chart == "hami"
    assert hv.ref == "HelmValues/values.yaml"
    assert hv.get("scheduler.kubeScheduler.enabled") is False
    assert hv.line_of("scheduler.kubeScheduler.enabled") == 24
    kuberay = load_text("image: {repository: x}\nbatchScheduler: {enabled: false}\n")
    assert kuberay.helm_values[0].chart == "kuberay-operator"
    unknown = load_text("just: data\n", "u.yaml")
    assert unknown.helm_values == ()
    assert unknown.skipped == ("u.yaml:1",)


def test_fleet_spec_is_read_for_its_pools() -> None:
    text = """\
models:
  - name: m
    source: builtin:gemma-3-270m
pools:
  - name: gpu
    labels: {pool: gpu}
    gpu: {count: 1, memory_gb: 24}
"""
    inv = load_text(text, "fleet.yaml")
    assert [p.name for p in inv.fleets[0].spec.pools] == ["gpu"]
    with pytest.raises(InputFileError, match=r"fleet\.yaml:1: fleet spec invalid"):
        load_text("models: []\n", "fleet.yaml")


@pytest.mark.parametrize(
    ("text", "line"),
    [("a: 1\nb: [1, 2\n", 3), ("kind: X\n  bad: indent\n", 2), ("- just\n- a list\n", 1)],
)
def test_unreadable_yaml_names_file_and_line(text: str, line: int) -> None:
    with pytest.raises(InputFileError, match=rf"^bad\.yaml:{line}:") as e:
        load_text(text, "bad.yaml")
    assert e.value.exit_code == 2


def test_python_scaling_config_with_constants() -> None:
    src = """\
import ray.train
from ray.train import ScalingConfig as SC

WORKERS = 2
CPUS = 2 * 2
RES = {"CPU": CPUS, "GPU": 1}

def main(n):
    a = ray.train.ScalingConfig(num_workers=WORKERS, use_gpu=True, resources_per_worker=RES)
    b = ScalingConfig({"CPU": 0}, n, False)
    return a, b
"""
    inv = load_python_text(src, "t.py")
    a, b = inv.scaling_configs
    assert (a.line, a.num_workers, a.use_gpu) == (9, 2, True)
    assert a.resources_per_worker == {"CPU": 4.0, "GPU": 1.0}
    assert a.trainer_resources is None
    assert a.unresolved == ()
    # Positional arguments follow ScalingConfig's field order; `n` is not a constant.
    assert b.trainer_resources == {"CPU": 0.0}
    assert b.num_workers is None
    assert b.unresolved == ("num_workers",)
    assert b.ref == "ScalingConfig/t.py:10"


def test_python_train_v2_flag() -> None:
    src = 'import os\nos.environ["RAY_TRAIN_V2_ENABLED"] = "0"\nScalingConfig(num_workers=1)\n'
    assert load_python_text(src).scaling_configs[0].train_v2 is False
    src = 'import os\nos.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")\nScalingConfig()\n'
    assert load_python_text(src).scaling_configs[0].train_v2 is True


def test_python_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    src = f"open({str(marker)!r}, 'w').write('x')\nScalingConfig(num_workers=1)\n"
    load_python_text(src)
    assert not marker.exists()


def test_python_syntax_error() -> None:
    with pytest.raises(InputFileError, match=r"^t\.py:2: Python syntax error"):
        load_python_text("x = 1\ndef (:\n", "t.py")


def test_directories_recursive_sorted_hidden_skipped(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / ".git").mkdir()
    for name in ("b/z.yml", "a.yaml", "c.py", "notes.txt", ".git/x.yaml"):
        (tmp_path / name).write_text("", encoding="utf-8")
    files = [p.relative_to(tmp_path).as_posix() for p in expand_paths([tmp_path])]
    assert files == ["a.yaml", "b/z.yml", "c.py"]
    # A file named twice is read once.
    assert len(expand_paths([tmp_path, tmp_path / "a.yaml"])) == 3
    with pytest.raises(InputFileError, match="no such file"):
        load_paths([tmp_path / "missing.yaml"])


def test_non_utf8_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_bytes(b"kind: \xff\n")
    with pytest.raises(InputFileError, match="not UTF-8"):
        load_paths([bad])


def test_line_of_inside_an_embedded_serve_config() -> None:
    text = """\
apiVersion: ray.io/v1
kind: RayService
metadata: {name: s}
spec:
  serveConfigV2: |
    applications:
      - name: app
        deployments:
          - name: A
          - name: B
            num_replicas: 2
"""
    [m] = load_text(text).manifests
    assert m.line_of("spec.serveConfigV2") == 5
    assert m.line_of("spec.serveConfigV2:applications[0].deployments[1]") == 10
    assert m.line_of("spec.serveConfigV2:applications[0].deployments[1].num_replicas") == 11
    assert m.line_of("spec.serveConfigV2:applications[0].nothing.here") == 7


def test_function_scope_constants() -> None:
    src = """\
from ray.train import ScalingConfig

def run(n):
    cpus = 3
    gpus = 1
    config = ScalingConfig(num_workers=n, resources_per_worker={"CPU": cpus, "GPU": gpus})
    cpus = 99  # after the call: not used
    return config
"""
    [call] = load_python_text(src).scaling_configs
    assert call.resources_per_worker == {"CPU": 3.0, "GPU": 1.0}
    assert call.unresolved == ("num_workers",)


def test_ray_remote_options_and_placement_groups() -> None:
    src = """\
import ray
from ray.util import placement_group

@ray.remote(num_gpus=1, resources={"accel": 1})
class Actor: ...

@ray.remote(num_cpus=2)
def task(): ...

@ray.remote
def plain(): ...

def main(x):
    task.options(num_cpus=4, memory=2 * 1024**3).remote()
    Actor.options(num_cpus=x).remote()  # unresolved: skipped
    return placement_group([{"CPU": 1}] * 1 + [{"GPU": 1}], "STRICT_PACK")
"""
    reqs = load_python_text(src, "job.py").ray_requests
    assert [(r.line, r.name, r.bundles, r.strategy) for r in reqs] == [
        (4, "Actor", ({"CPU": 0.0, "GPU": 1.0, "accel": 1.0},), None),
        (7, "task", ({"CPU": 2.0},), None),
        (14, "options(...)", ({"CPU": 4.0, "memory": 2.0 * 1024**3},), None),
    ]
    # A list built with `*` is not a literal the loader resolves: the group is skipped.
    assert all(r.kind == "remote" for r in reqs)
    assert reqs[0].ref == "RayRemote/job.py:4"


def test_wrong_shaped_arguments_count_as_unresolved() -> None:
    src = 'ScalingConfig(num_workers=2, resources_per_worker={"CPU": "4"}, use_gpu="yes")\n'
    [call] = load_python_text(src).scaling_configs
    assert call.resources_per_worker is None
    assert call.unresolved == ("resources_per_worker", "use_gpu")


def test_helm_chart_templates_are_skipped_in_directory_walks(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: x\nversion: 0.1.0\n", "utf-8")
    (chart / "values.yaml").write_text("scheduler: {kubeScheduler: {enabled: true}}\n", "utf-8")
    tpl = chart / "templates" / "svc.yaml"
    tpl.write_text("metadata:\n  name: {{ .Release.Name }}-svc\n", "utf-8")
    assert [p.name for p in expand_paths([tmp_path])] == ["Chart.yaml", "values.yaml"]
    with pytest.raises(InputFileError):
        load_paths([tpl])  # named explicitly: read, and it is not YAML


def test_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    inv = load_paths(["-"])
    found = [(m.ref, m.file, m.line) for m in inv.manifests]
    assert found == [("Namespace/default/a", "<stdin>", 1)]
