"""Workloads: where benchmark prompts come from (file, synthetic, shared-prefix, ShareGPT)."""

from fleetserve.bench.workload.base import BenchRequest, Workload
from fleetserve.bench.workload.prompt_file import PromptFileWorkload
from fleetserve.bench.workload.shared_prefix import SharedPrefixWorkload
from fleetserve.bench.workload.sharegpt import ShareGptWorkload
from fleetserve.bench.workload.synthetic import SyntheticWorkload

__all__ = [
    "BenchRequest",
    "PromptFileWorkload",
    "ShareGptWorkload",
    "SharedPrefixWorkload",
    "SyntheticWorkload",
    "Workload",
]
