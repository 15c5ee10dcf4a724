"""Small PromQL building blocks shared by alerts and dashboards (pure string functions).

What must stay true: label values are escaped, matchers come out in a stable (sorted) order,
so the same inputs always give byte-identical queries (rendered manifests are GitOps-diffed).
"""

from __future__ import annotations

from collections.abc import Mapping


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def matchers(selector: Mapping[str, str] | None, *extra: str) -> str:
    """``{k="v",...,extra}`` from an equality selector plus raw extra matchers ('' if none)."""
    parts = [f'{key}="{_escape(value)}"' for key, value in sorted((selector or {}).items())]
    parts.extend(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def series(name: str, selector: Mapping[str, str] | None, *extra: str) -> str:
    """A series selector: ``name{...}``."""
    return f"{name}{matchers(selector, *extra)}"


#: Matcher for HTTP 5xx responses (Ray Serve's ``status_code`` label).
STATUS_5XX = 'status_code=~"5.."'
