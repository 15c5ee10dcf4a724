"""``fleetserve observe dashboard|rules``: print the Grafana dashboard or the alert rules.

For clusters not rendered by fleetserve (or to load into an existing Grafana/Prometheus):
``observe rules`` prints a Prometheus rule file (``promtool check rules`` accepts it),
``observe dashboard`` the dashboard JSON (Grafana's "Import dashboard").
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from fleetserve.errors import UsageError
from fleetserve.observe.alerts import rule_groups
from fleetserve.observe.dashboard import grafana_dashboard


def parse_selector(pairs: list[str]) -> dict[str, str]:
    """``LABEL=VALUE`` pairs (``--selector``) as a mapping; UsageError names a bad one."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--selector {pair!r}: expected LABEL=VALUE (e.g. namespace=llm)")
        out[key] = value
    return out


def _handle(args: argparse.Namespace) -> int:
    selector = parse_selector(args.selector)
    doc: Any
    if args.what == "dashboard":
        doc = grafana_dashboard(selector or None)
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    else:
        doc = rule_groups(selector or None)
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, width=1_000_000))
    return 0


def register(subparsers: Any) -> None:
    """Add ``observe`` to the CLI."""
    parser = subparsers.add_parser(
        "observe",
        help="print fleetserve's Grafana dashboard or Prometheus alert rules",
        description=__doc__,
    )
    parser.add_argument("what", choices=["dashboard", "rules"], help="what to print")
    parser.add_argument(
        "--selector",
        action="append",
        default=[],
        metavar="LABEL=VALUE",
        help="scope every query to series with this label (repeatable), e.g. namespace=llm",
    )
    parser.set_defaults(handler=_handle)
