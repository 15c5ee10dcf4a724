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
    [bad] = load_text("models: []\n", "fleet.yaml").problems
    assert (bad.file, bad.line, bad.kind) == ("fleet.yaml", 1, "fleet-spec")
    assert bad.detail.startswith("fleet spec invalid: <spec>: models: List should have")


def test_values_with_a_models_key_are_not_a_fleet_spec() -> None:
    # Shape of substratusai/kubeai hack/dev-gke-helm-values.yaml: KubeAI's chart values have
    # `models` beside keys no fleet spec has; they are not a broken fleet spec.
    inv = load_text("models:\n  catalog: {}\nresourceProfiles:\n  nvidia-gpu-l4: {}\n", "v.yaml")
    assert (inv.problems, inv.fleets, inv.skipped) == ((), (), ("v.yaml:1",))


@pytest.mark.parametrize(
    ("text", "line"), [("a: 1\nb: [1, 2\n", 3), ("kind: X\n  bad: indent\n", 2)]
)
def test_unreadable_yaml_is_a_problem_naming_file_and_line(text: str, line: int) -> None:
    inv = load_text(f"kind: ConfigMap\n---\n{text}", "bad.yaml")
    [bad] = inv.problems
    assert (bad.file, bad.line - 2, bad.kind) == ("bad.yaml", line, "yaml")
    assert bad.detail.startswith("invalid YAML: ")
    # The whole file is left out, the documents before the error too: nothing half-read.
    assert inv.manifests == ()


def test_a_list_document_is_skipped_not_refused() -> None:
    # kustomize JSON patches (kubernetes-sigs/lws config/components/prometheus/
    # monitor_tls_patch.yaml) and Ansible playbooks are lists at the top.
    inv = load_text("- op: add\n  path: /spec/endpoints/0/scheme\n  value: https\n", "p.yaml")
    assert (inv.problems, inv.skipped) == ((), ("p.yaml:1",))


def test_tags_without_a_constructor_are_read_as_plain_values() -> None:
    # Shape of kubernetes-sigs/gateway-api-inference-extension mkdocs.yml (a Python tag) and
    # CloudFormation's !Ref: valid YAML, never "unreadable".
    inv = load_text("kind: X\na: !!python/name:material.extensions.emoji.twemoji\nb: !Ref Y\n")
    assert inv.problems == ()
    assert inv.manifests[0].body["b"] == "Y"


def test_template_is_told_from_broken_yaml() -> None:
    text = "# {{ not this one }} (a comment)\nkind: RayCluster\nmetadata:\n  name: {{.Name}}\n"
    [tpl] = load_text(text, "t.yaml").problems
    assert (tpl.kind, tpl.placeholder, tpl.placeholder_line) == ("template", "{{.Name}}", 4)
    [bad] = load_text("# {{ x }}\nkind: [\n", "b.yaml").problems
    assert bad.kind == "yaml"  # a placeholder only in a comment proves nothing


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
    [bad] = load_python_text("x = 1\ndef (:\n", "t.py").problems
    assert (bad.file, bad.line, bad.kind) == ("t.py", 2, "python")
    assert bad.detail.startswith("Python syntax error")


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
    [problem] = load_paths([bad]).problems
    assert (problem.kind, problem.file) == ("encoding", str(bad))
    assert "not UTF-8" in problem.detail


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
    # Named explicitly: read, and reported as the template it is.
    assert [p.kind for p in load_paths([tpl]).problems] == ["template"]


def test_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    inv = load_paths(["-"])
    found = [(m.ref, m.file, m.line) for m in inv.manifests]
    assert found == [("Namespace/default/a", "<stdin>", 1)]


def test_kustomize_patches_are_not_judged_alone(tmp_path: Path) -> None:
    # Shape of kubernetes-sigs/lws config/default: a kustomization patching the manager
    # Deployment with a partial object (no selector: the base has it), and kubebuilder's
    # patches/ folder whose CA-injection patch is enabled only by uncommenting a line.
    (tmp_path / "patches").mkdir()
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [manager.yaml]\npatches:\n- path: manager_config_patch.yaml\n"
        "#- path: patches/cainjection.yaml\n",
        "utf-8",
    )
    deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: manager}\n"
    (tmp_path / "manager.yaml").write_text(deployment + "spec: {selector: {}}\n", "utf-8")
    (tmp_path / "manager_config_patch.yaml").write_text(deployment + "spec: {}\n", "utf-8")
    (tmp_path / "patches" / "cainjection.yaml").write_text(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
        "metadata: {name: x, annotations: {a: b}}\n",
        "utf-8",
    )
    inv = load_paths([tmp_path])
    assert [Path(m.file).name for m in inv.manifests] == ["manager.yaml"]
    assert sorted(Path(m.file).name for m in inv.patches) == [
        "cainjection.yaml",
        "manager_config_patch.yaml",
    ]


def test_terraform_templatefile_is_a_template() -> None:
    # Shape of awslabs/data-on-eks infra/terraform/helm-values/spark-operator.yaml.
    text = "controller:\n  replicas: 1\n%{ if enable_ipv6 ~}\n  env: []\n%{ endif ~}\n"
    [tpl] = load_text(text, "v.yaml").problems
    assert (tpl.kind, tpl.placeholder, tpl.placeholder_line) == (
        "template",
        "%{ if enable_ipv6 ~}",
        3,
    )
