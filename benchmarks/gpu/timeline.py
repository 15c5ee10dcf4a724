"""Where a request's time goes on fleetserve's serving path, from the per-request timelines
that ``matrix.py overhead --timeline`` has the fleet write (fleetserve.observe.timeline).

    python benchmarks/gpu/timeline.py RESULTS_DIR [--target fleetserve]
    python benchmarks/gpu/timeline.py RESULTS_DIR --waves   # every server, client's view

Design note. Every process on the path wrote ``<relay stream id> <point> <monotonic ns>``
lines; a request's points, in order:

    i_recv  the ingress's gateway took the HTTP request (headers and routing done)
    i_call  the gateway handed it to Serve (DeploymentHandle call made)
    i_route our request router was asked for a replica (the first time)
    i_routed  Serve told the router the replica took it (after r_recv: a gRPC round trip)
    r_recv  the model replica's handler began (Serve's router, the gRPC hop)
    r_head  vLLM's app answered its response head (request parsed, prompt tokenised)
    r_data  the replica relayed the first body bytes (the engine's queue and prefill)
    i_data  the ingress had them (the relay hop)
    r_end / i_end  the stream's end at the replica / the ingress

A handed-off stream (``frontend: process``, ``server.stream_handoff``) passes no token
through the replica; in place of r_head, r_data:

    r_handoff  the replica sent HANDOFF (the request admitted and held)
    i_handoff  the ingress took it and sends the request to the engine's server
    i_head     the server's response head (request parsed, prompt tokenised)
    i_data     its first body bytes (the engine's queue and prefill)
    r_end      the replica's hold ended (the ingress released it, after i_end)

A run of the client is a stretch of time in which some request is in flight; a wave is a
group of requests received within :data:`WAVE_GAP_S` of each other (vLLM's client with
equal lengths and ``--ignore-eos`` sends its requests in waves: they all end at one engine
step and the next ones arrive together). Per run it prints each segment's median and 90th
percentile, and per wave how long the wave took to get into the ingress, into the replica,
past vLLM's app and to its first tokens: a serial stage shows as a spread that grows with
the wave's size. The client's own result files (``<target>-c<N>.json``, saved with
per-request TTFTs) give the client's TTFT beside the server's.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

SEGMENTS = [
    ("gateway", "i_recv", "i_call"),
    ("to the router", "i_call", "i_route"),
    ("router to replica", "i_route", "r_recv"),
    ("serve hop", "i_call", "r_recv"),
    ("accepted", "r_recv", "i_routed"),
    ("vLLM app", "r_recv", "r_head"),
    ("engine 1st token", "r_head", "r_data"),
    ("relay back", "r_data", "i_data"),
    ("server TTFT", "i_recv", "i_data"),
    ("end relay", "r_end", "i_end"),
    # a handed-off stream's (no r_head, r_data; its r_end comes after i_end)
    ("handoff back", "r_handoff", "i_handoff"),
    ("server's app", "i_handoff", "i_head"),
    ("server 1st token", "i_head", "i_data"),
    ("release", "i_end", "r_end"),
]
#: Segments of one path only: a relayed stream's end, a handed-off stream's release.
RELAYED_ONLY = frozenset({"end relay"})
HANDED_OFF_ONLY = frozenset({"release"})
T = TypeVar("T")

#: Requests received within this of the previous one belong to its wave.
WAVE_GAP_S = 0.05
#: A gap of this with nothing in flight separates two client runs.
RUN_GAP_S = 0.5


def load(directory: Path) -> dict[int, dict[str, float]]:
    """stream id -> point -> seconds (monotonic), over every process's file."""
    requests: dict[int, dict[str, float]] = defaultdict(dict)
    for path in sorted(directory.glob("timeline-*.tsv")):
        for line in path.read_text().splitlines():
            stream, point, ns = line.split("\t")
            # the first time a point is passed (Serve may route a request more than once)
            requests[int(stream)].setdefault(point, int(ns) / 1e9)
    return {k: v for k, v in requests.items() if "i_recv" in v and "i_end" in v}


def runs(requests: dict[int, dict[str, float]]) -> list[list[dict[str, float]]]:
    """The requests grouped into client runs (stretches with something in flight)."""
    ordered = sorted(requests.values(), key=lambda r: r["i_recv"])
    out: list[list[dict[str, float]]] = []
    end = -1.0
    for r in ordered:
        if not out or r["i_recv"] > end + RUN_GAP_S:
            out.append([])
        out[-1].append(r)
        end = max(end, r["i_end"])
    return out


def waves(items: list[T], at: Callable[[T], float]) -> list[list[T]]:
    """``items`` (in time order) grouped into waves: each within :data:`WAVE_GAP_S` of the
    one before, by ``at``."""
    out: list[list[T]] = []
    last = None
    for item in items:
        if last is None or at(item) - last > WAVE_GAP_S:
            out.append([])
        out[-1].append(item)
        last = at(item)
    return out


def pct(values: list[float], q: float) -> float:
    """The ``q``-th percentile as `fleetserve bench` reports them (numpy's linear rule)."""
    return float(np.percentile(values, q)) if values else float("nan")


def report(directory: Path, client: list[dict[str, object]]) -> None:
    requests = load(directory)
    print(f"{directory}: {len(requests)} requests with a whole timeline")
    for i, run in enumerate(runs(requests)):
        c = client[i] if i < len(client) else {}
        head = f"run {i + 1}: {len(run)} requests"
        if c:
            head += f" (client: {c.get('num_prompts')} prompts, c = {c.get('max_concurrency')}, "
            head += f"TTFT p50 {c.get('median_ttft_ms', 0):.1f} ms)"
        print(head)
        for name, a, b in SEGMENTS:
            d = [
                1000 * (r[b] - r[a])
                for r in run
                if a in r
                and b in r
                and not (name in RELAYED_ONLY and "i_handoff" in r)
                and not (name in HANDED_OFF_ONLY and "i_handoff" not in r)
            ]
            if not d:  # the other path's segment (relayed or handed off)
                continue
            print(f"  {name:17s} p50 {pct(d, 50):8.2f} ms  p90 {pct(d, 90):8.2f} ms")
        ws = waves(run, lambda r: r["i_recv"])
        sizes = [len(w) for w in ws]
        print(f"  waves: {len(ws)}, sizes p50 {pct([float(s) for s in sizes], 50):.0f}")
        big = [w for w in ws if len(w) >= max(sizes) // 2]
        for label, point in (
            ("into the ingress", "i_recv"),
            ("handed to Serve", "i_call"),
            ("at the router", "i_route"),
            ("in the replica", "r_recv"),
            ("past vLLM's app", "r_head"),
            ("handed off", "i_handoff"),
            ("past the server's app", "i_head"),
            ("first token out", "i_data"),
        ):
            spans = []
            for w in big:
                t0 = w[0]["i_recv"]
                got = sorted(r[point] - t0 for r in w if point in r)
                if got:
                    spans.append((1000 * got[len(got) // 2], 1000 * got[-1]))
            if spans:
                med = statistics.median(s[0] for s in spans)
                last = statistics.median(s[1] for s in spans)
                print(
                    f"  wave's {label:17s} median request +{med:8.1f} ms, last +{last:8.1f} ms"
                    " (from the wave's first arrival)"
                )


def client_waves(path: Path) -> str | None:
    """One client run's waves from the client's side alone (its per-request send times and
    TTFTs), so `vllm serve` - which writes no timeline - is read the same way: how long the
    client took to send a wave, and when the wave's first, median and last first tokens came,
    from the wave's first send (medians over the waves of at least half the largest size)."""
    r = json.loads(path.read_text())
    if "start_times" not in r or "ttfts" not in r:
        return None
    sent = sorted(zip(r["start_times"], r["ttfts"], strict=False))
    groups = waves(sent, lambda x: x[0])
    if not groups:
        return None
    largest = max(len(g) for g in groups)
    big = [g for g in groups if len(g) >= max(2, largest // 2)]
    if not big:
        return None
    span = statistics.median(1000 * (g[-1][0] - g[0][0]) for g in big)
    firsts = [sorted(1000 * (s + t - g[0][0]) for s, t in g) for g in big]
    first = statistics.median(f[0] for f in firsts)
    mid = statistics.median(f[len(f) // 2] for f in firsts)
    end = statistics.median(f[-1] for f in firsts)
    line = (
        f"{path.name}: {len(big)} waves of {largest}; sent over {span:.1f} ms; first tokens "
        f"at +{first:.1f} (first), +{mid:.1f} (median), +{end:.1f} ms (last)"
    )
    heads = [gaps[0] for gaps in r.get("itl_head", []) if gaps]
    if heads:  # a first chunk held on the way out comes with the second: a gap near 0
        ms = [1000 * g for g in heads]
        line += f"; first gap p10 {pct(ms, 10):.1f}, p50 {pct(ms, 50):.1f} ms"
    return line


def client_runs(results: Path, target: str) -> list[dict[str, object]]:
    found = []
    mine = re.compile(rf"{re.escape(target)}(-warmup)?-c\d+(-r\d+)?\.json")
    for path in sorted(results.glob(f"{target}-*.json")):
        if not mine.fullmatch(path.name):
            continue
        r = json.loads(path.read_text())
        found.append((r.get("date", ""), path.name, r))
    return [r for _, _, r in sorted(found)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a matrix phase's output directory")
    ap.add_argument("--target", default="fleetserve")
    ap.add_argument(
        "--waves",
        action="store_true",
        help="only the client's view of every run's waves, every server (vllm included)",
    )
    a = ap.parse_args()
    if a.waves:
        for path in sorted(a.results.glob("*-c*.json")):
            line = client_waves(path)
            if line:
                print(line)
        return
    report(a.results / f"timeline-{a.target}", client_runs(a.results, a.target))


if __name__ == "__main__":
    main()
