"""The security advisories doctor rules cite: one record per advisory, its affected releases.

Design note: a security rule says which advisory a finding comes from, which releases it
affects and which release fixes it; those facts live here once, so a rule's message, its
severity and the catalogue never disagree. Each range is the one the GitHub advisory (and
OSV, which mirrors it) publishes for the PyPI package, checked when the record was written;
``fixed_in`` None means no release fixes it (the project treats it as by design, or removed
the code instead). A rule judges a release it read from the manifest (an image tag, the
``rayVersion``) with :meth:`Advisory.affects`; with no release it words the finding so it is
true for every release and names the range.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from fleetserve.k8s.doctor.rules._versions import KnownVersion


@dataclass(frozen=True)
class Advisory:
    """One published advisory: ids, the component, the affected releases, the fix."""

    #: GitHub advisory id (``GHSA-...``).
    ghsa: str
    cve: str
    #: ``vLLM`` or ``Ray``.
    component: str
    #: First affected release (None: every release before ``fixed_in``).
    affected_from: Version | None
    #: First release without the flaw (None: not fixed in any release).
    fixed_in: Version | None
    #: What it lets an attacker do, for messages.
    impact: str
    #: From this release the affected code is vLLM's V0 engine, which runs only when the
    #: environment sets ``VLLM_USE_V1=0`` (V1 is the default from 0.8.0).
    v0_only_from: Version | None = None

    @property
    def ids(self) -> str:
        """``CVE-2025-32444, GHSA-hj4w-hm2g-p6w5``."""
        return f"{self.cve}, {self.ghsa}"

    def affects(self, v: KnownVersion | None, env: dict[str, str] | None = None) -> bool | None:
        """Whether the release ``v`` (run with ``env``) is affected; None when the release is
        unknown."""
        if v is None:
            return None
        if self.affected_from is not None and not v.at_least(self.affected_from):
            return False
        if self.fixed_in is not None and v.at_least(self.fixed_in):
            return False
        if self.v0_only_from is not None and v.at_least(self.v0_only_from):
            return (env or {}).get("VLLM_USE_V1", "").strip() == "0"
        return True

    def releases(self) -> str:
        """``vLLM 0.6.5 up to 0.8.5, fixed there`` / ``every Ray release, not fixed``."""
        start = f"{self.component} {self.affected_from}" if self.affected_from else None
        if self.fixed_in is None:
            span = f"{start} and later" if start else f"every {self.component} release"
            return f"{span}, not fixed in any release"
        if start:
            return f"{start} up to {self.fixed_in}, fixed there"
        return f"{self.component} before {self.fixed_in}, fixed there"

    def cite(self) -> str:
        """``CVE-..., GHSA-... (<releases>): <impact>`` for messages."""
        return f"{self.ids} ({self.releases()}): {self.impact}"


# --------------------------------------------------------------------------- Ray

#: ShadowRay: the Jobs API (dashboard port 8265) runs any submitted code, no authentication.
#: Anyscale disputes it (Ray assumes a trusted network) and ships no fix; Ray 2.52 adds
#: opt-in token authentication (``RAY_AUTH_MODE=token``, KubeRay ``authOptions``).
RAY_SHADOWRAY = Advisory(
    "GHSA-6wgj-66m2-xxp2",
    "CVE-2023-48022",
    "Ray",
    None,
    None,
    "anyone who reaches the dashboard's Jobs API, the GCS or the client port runs code on "
    "the cluster (ShadowRay, exploited in the wild; disputed by Anyscale, so no release "
    "fixes it - Ray 2.52 adds opt-in token authentication)",
)
#: Ray before 2.52.0: the dashboard's browser guard (User-Agent "Mozilla" prefix) is
#: bypassable, so a web page a developer opens reaches a dashboard on localhost or the
#: cluster network through DNS rebinding and submits jobs (CISA KEV, August 2026).
RAY_DNS_REBINDING = Advisory(
    "GHSA-q279-jhrf-cc6v",
    "CVE-2025-62593",
    "Ray",
    None,
    Version("2.52.0"),
    "a web page opened by anyone who can reach the dashboard submits jobs to it through DNS "
    "rebinding",
)

# --------------------------------------------------------------------------- vLLM

#: Multi-node V0 engine: the workers unpickle what arrives on the ZeroMQ socket they connect
#: to; V0 is off by default from 0.8.0 and removed in 0.10.0 (the advisory's "fix").
VLLM_MULTINODE_PICKLE = Advisory(
    "GHSA-9pcc-gvx5-r5wm",
    "CVE-2025-30165",
    "vLLM",
    Version("0.5.2"),
    Version("0.10.0"),
    "the V0 engine's multi-node workers unpickle what arrives on their ZeroMQ socket: code "
    "execution on every node for whoever reaches it (V0 is the default before 0.8.0, and "
    "runs with VLLM_USE_V1=0 until its removal in 0.10.0)",
    v0_only_from=Version("0.8.0"),
)
#: Multi-node: the XPUB ZeroMQ publisher bound every interface.
VLLM_MULTINODE_XPUB = Advisory(
    "GHSA-9f8f-2vmf-885j",
    "CVE-2025-30202",
    "vLLM",
    Version("0.5.2"),
    Version("0.8.5"),
    "the multi-node ZeroMQ publisher listens on every interface: any client can subscribe, "
    "read the broadcast and stall the group",
)
#: Mooncake KV transfer: ``recv_pyobj`` (pickle) on a ZeroMQ socket bound to every interface.
VLLM_MOONCAKE_PICKLE = Advisory(
    "GHSA-hj4w-hm2g-p6w5",
    "CVE-2025-32444",
    "vLLM",
    Version("0.6.5"),
    Version("0.8.5"),
    "the Mooncake KV-transfer integration unpickles what arrives on a ZeroMQ socket bound to "
    "every interface: unauthenticated code execution",
)
#: PyNcclPipe KV transfer (PyNcclConnector, V0): unpickles its CPU-side control messages,
#: and its TCPStore listened on every interface.
VLLM_PYNCCL_PICKLE = Advisory(
    "GHSA-hjq4-87xh-g4fv",
    "CVE-2025-47277",
    "vLLM",
    Version("0.6.5"),
    Version("0.8.5"),
    "the PyNcclPipe KV-transfer service unpickles what it receives, and its TCPStore "
    "listens on every interface: unauthenticated code execution",
)
#: ``--enable-prompt-embeds``: torch.load of client tensors, sparse ones densified without
#: validating their indices (an out-of-bounds write). 0.11.1 only turned the feature off by
#: default (vllm-project/vllm#27204).
VLLM_PROMPT_EMBEDS = Advisory(
    "GHSA-mrw7-hf4f-83pf",
    "CVE-2025-62164",
    "vLLM",
    Version("0.10.2"),
    Version("0.11.1"),
    "a crafted sparse tensor sent as prompt embeddings corrupts the engine's memory (a crash, "
    "possibly code execution)",
)
#: The follow-up: with the flag on, the same tensors stay dangerous until 0.13.0 added the
#: sparse-tensor invariant checks (vllm-project/vllm#30649).
VLLM_PROMPT_EMBEDS_VALIDATION = Advisory(
    "GHSA-mcmc-2m55-j8jj",
    "CVE-2026-56340",
    "vLLM",
    Version("0.10.2"),
    Version("0.13.0"),
    "with --enable-prompt-embeds on, 0.11.1's fix leaves the crafted sparse tensors "
    "unvalidated (0.13.0 checks their indices)",
)
#: Prompt embeddings without token ids crash EngineCore on M-RoPE models (Qwen2-VL and
#: its successors) through an assertion.
VLLM_PROMPT_EMBEDS_MROPE = Advisory(
    "GHSA-33cg-gxv8-3p8g",
    "CVE-2026-55514",
    "vLLM",
    Version("0.12.0"),
    Version("0.24.0"),
    "one prompt-embeddings request crashes the engine when the model uses M-RoPE (the "
    "Qwen2-VL family)",
)
