"""The discrete-event simulation of a fleet: clients, routers, engines, autoscaling.

Design note. One heap of timed events, five kinds: a request arriving at its model's router
(after the calibrated serving overhead), an engine's step (or run of decode steps,
:mod:`fleetserve.sim.engine`) ending, an autoscaling tick, a new replica becoming ready, and
a request entering its replica's engine once the replica's serving loop, which takes
requests in one at a time (``Calibration.admission_s``), has taken it in.
Engines reschedule themselves; a stale engine event (the engine cut its run short for a
newcomer) is recognised by its version and skipped. Each open-loop stream keeps exactly one
pending arrival in the heap and each closed-loop stream sends its next request when one
finishes, so the heap stays O(engines + streams) however long the run.

Routers reuse fleetserve's own decision (:mod:`fleetserve.serve.routing.policy`, pure):
``prefix`` ranks replicas with :func:`rank_replicas` over a :class:`PrefixIndex` fed by the
router's own decisions, exactly as the ingress does, for requests carrying a shared prefix;
a request without one has nothing to match, and the ranking reduces to its load terms - the
least-loaded replica with room, then lower KV usage - which is computed directly (the same
order, without building views for every replica). ``pow2`` is Ray Serve's power of two
choices on queue length; ``round_robin`` takes replicas in turn. A replica at
``max_ongoing_requests`` takes nothing; when all are, requests wait in the model's queue
(``max_queued_requests``, beyond it they fail with 503 as the ingress answers).

Autoscaling follows the spec's policy through fleetserve's own rule
(:func:`fleetserve.serve.control.autoscaling.desired_replicas`: ongoing requests, KV usage and
waiting requests against their targets, averaged over ``look_back_period_s``), with Ray
Serve's ``upscale_delay_s`` / ``downscale_delay_s`` and ``min``/``max``; a new replica takes
its place from the plan's ``max`` scenario and serves after ``cold_start_s``; a removed one
stops taking requests and finishes those it holds.

Finished requests go to their stream: as objects when the run keeps records, else as
columns of numbers (:mod:`fleetserve.sim.columns`: a fleet-hour finishes tens of millions).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from fleetserve.perf.model import EnginePerf
from fleetserve.serve.control.autoscaling import LoadSignals, ScalingTargets, desired_replicas
from fleetserve.serve.routing.index import PrefixIndex
from fleetserve.serve.routing.policy import PrefixParams, ReplicaView, rank_replicas
from fleetserve.sim.columns import FinishedColumns
from fleetserve.sim.engine import REJECTED, TIMEOUT, Card, EngineSim, SimRequest
from fleetserve.spec import ReplicaSpec, RoutingSpec

#: Characters per prompt token when turning a shared prefix into router blocks (the
#: router hashes text in ``block_chars`` pieces; English text runs ~4 characters a token).
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class ReplicaSetup:
    """One planned replica: its engine model and limits, and the card it shares."""

    id: str
    card: str
    perf: EnginePerf
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_blocks: int
    block_size: int


@dataclass(frozen=True)
class ModelSetup:
    """One model: its planned replicas (the first ``replicas.min`` start), routing, scaling."""

    name: str
    replicas: tuple[ReplicaSetup, ...]
    replica_spec: ReplicaSpec
    routing: RoutingSpec
    start: int
    """Replicas running at time 0."""


@dataclass
class StreamRun:
    """A stream's requests as the simulation consumes them."""

    id: int
    model: str
    label: str
    x: float
    source: Iterator[tuple[float, int, int, int, int, bool]]
    """(send time or -1 for closed loop, prompt, output, group, prefix tokens, warmup)."""
    concurrency: int | None = None
    done: list[SimRequest] = field(default_factory=list)
    """Finished requests (records are built from them) ..."""
    columns: FinishedColumns | None = None
    """... or, when the run keeps no records, their numbers only (:mod:`.columns`)."""

    @property
    def finished(self) -> int:
        """Requests finished (or failed) so far."""
        return len(self.columns) if self.columns is not None else len(self.done)


class _Deployment:
    __slots__ = (
        "_index",
        "_params",
        "_rr",
        "_samples",
        "_scale_since",
        "cap",
        "engines",
        "least_loaded",
        "name",
        "pending",
        "queue",
        "setup",
        "spare",
    )

    def __init__(self, setup: ModelSetup) -> None:
        self.setup = setup
        self.name = setup.name
        self.engines: list[EngineSim] = []
        self.spare: list[ReplicaSetup] = []
        self.pending = 0
        self.queue: deque[SimRequest] = deque()
        r = setup.routing
        self.cap = setup.replica_spec.max_ongoing_requests
        self.least_loaded = r.policy == "prefix"
        """A request without a shared prefix takes the least-loaded replica (module note)."""
        self._params = PrefixParams(r.load_factor, r.load_weight, r.adapter_weight)
        self._index = PrefixIndex()
        self._rr = 0
        self._samples: deque[tuple[float, float, float, float]] = deque()
        self._scale_since: tuple[int, float] | None = None


class FleetSimulation:
    """Runs streams against models (see the module note)."""

    def __init__(
        self,
        models: list[ModelSetup],
        streams: list[StreamRun],
        *,
        request_overhead_s: float = 0.0,
        seed: int = 0,
        keep_itl: bool = False,
        cold_start_s: float = 60.0,
        autoscale_period_s: float = 1.0,
        horizon_s: float | None = None,
        columns: bool = False,
    ) -> None:
        """``columns``: keep finished requests as columns, not objects (no records)."""
        self._rng = random.Random(seed)
        self._overhead = request_overhead_s
        self._keep_itl = keep_itl
        self._cold = cold_start_s
        self._tick = autoscale_period_s
        self._horizon = horizon_s
        self._cards: dict[str, Card] = {}
        self._deps: dict[str, _Deployment] = {}
        for m in models:
            dep = _Deployment(m)
            for i, rs in enumerate(m.replicas):
                if i < m.start:
                    dep.engines.append(self._engine(m.name, rs))
                else:
                    dep.spare.append(rs)
            self._deps[m.name] = dep
        self.streams = streams
        for s in streams:
            if columns and s.columns is None:
                s.columns = FinishedColumns()
        # Where each stream's finished requests go, by stream id (hot path: one call).
        self._sinks: list[Callable[[SimRequest], None]] = [
            s.columns.add if s.columns is not None else s.done.append for s in streams
        ]
        # (time, sequence, kind, object, engine version): the object is a request, an
        # engine, None or a (deployment, replica) pair by kind (see run()).
        self._heap: list[tuple[float, int, int, Any, int]] = []
        self._seq = 0
        self._next_id = 0
        self.now = 0.0
        self.replica_seconds: dict[str, float] = {m.name: 0.0 for m in models}
        self.scale_events: list[tuple[float, str, int]] = []
        self.stopped_at_horizon = False
        """Whether the run stopped at the horizon with events left (see run())."""

    @property
    def deployments(self) -> dict[str, _Deployment]:
        """Each model's router, queue and engines (those running at the end)."""
        return self._deps

    # ------------------------------------------------------------------ plumbing

    def _engine(self, model: str, rs: ReplicaSetup) -> EngineSim:
        card = self._cards.get(rs.card)
        if card is None:
            card = self._cards[rs.card] = Card(rs.card)
        return EngineSim(
            rs.id,
            model,
            rs.perf,
            card,
            max_num_seqs=rs.max_num_seqs,
            max_num_batched_tokens=rs.max_num_batched_tokens,
            kv_blocks=rs.kv_blocks,
            block_size=rs.block_size,
            keep_itl=self._keep_itl,
        )

    def _push(self, t: float, kind: int, obj: object, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, obj, version))

    def _send_next(self, stream: StreamRun, now: float) -> None:
        """Queue the stream's next request (open loop: at its time; closed: now)."""
        nxt = next(stream.source, None)
        if nxt is None:
            return
        t, prompt, output, group, prefix, warm = nxt
        sent = now if t < 0 else t
        req = SimRequest(
            self._next_id,
            stream.id,
            prompt,
            max(1, output),
            sent,
            warm,
            group,
            prefix,
            sent,
        )
        self._next_id += 1
        self._push(sent + self._overhead, 0, req)

    # ------------------------------------------------------------------ routing

    def _route(self, dep: _Deployment, req: SimRequest, now: float) -> None:
        engine = self._choose(dep, req)
        if engine is None:
            if len(dep.queue) >= dep.setup.replica_spec.max_queued_requests:
                req.failed, req.end = REJECTED, now
                self._sinks[req.stream](req)
                self._after_done(req, now)
                return
            dep.queue.append(req)
            return
        self._submit(engine, req, now)

    def _submit(self, engine: EngineSim, req: SimRequest, now: float) -> None:
        if engine.admission_s > 0:
            # the replica's serving loop takes requests in one at a time (kind 4: enter)
            self._push(engine.admit(req, now), 4, req)
            return
        t = engine.submit(req, now)
        if t is not None:
            self._push(t, 1, engine, engine.version)

    def _choose(self, dep: _Deployment, req: SimRequest) -> EngineSim | None:
        cap = dep.cap
        if dep.least_loaded and (req.group < 0 or req.prefix <= 0):
            return _least_loaded(dep.engines, cap)
        engines = [e for e in dep.engines if e.active and e.load < cap]
        if not engines:
            return None
        policy = dep.setup.routing.policy
        if len(engines) == 1:
            chosen = engines[0]
        elif policy == "pow2":
            a, b = self._rng.sample(engines, 2)
            chosen = a if a.load <= b.load else b
        elif policy == "round_robin":
            dep._rr += 1
            chosen = engines[dep._rr % len(engines)]
        else:  # prefix, a request with a shared prefix (those without: _least_loaded)
            blocks = _prefix_blocks(req.group, req.prefix, dep.setup.routing.block_chars)
            views = [ReplicaView(e.id, e.load, cap, e.kv_usage) for e in engines]
            order = rank_replicas(blocks, views, dep._index, dep._params).order
            by_id = {e.id: e for e in engines}
            chosen = by_id[order[0]]
            dep._index.add(chosen.id, blocks)
        return chosen

    # ------------------------------------------------------------------ completion

    def _after_done(self, req: SimRequest, now: float) -> None:
        stream = self.streams[req.stream]
        if stream.concurrency is not None:
            self._send_next(stream, now)

    def _drain_queue(self, dep: _Deployment, now: float) -> None:
        while dep.queue:
            engine = self._choose(dep, dep.queue[0])
            if engine is None:
                return
            self._submit(engine, dep.queue.popleft(), now)

    # ------------------------------------------------------------------ autoscaling

    def _autoscale(self, now: float) -> None:
        for dep in self._deps.values():
            spec = dep.setup.replica_spec
            live = [e for e in dep.engines if e.active]
            self.replica_seconds[dep.name] += (len(live) + dep.pending) * self._tick
            if spec.max <= spec.min:
                continue
            ongoing = sum(e.load for e in live) + len(dep.queue)
            waiting = sum(len(e.waiting) for e in live)
            kv = sum(e.kv_usage for e in live) / len(live) if live else 0.0
            dep._samples.append((now, ongoing, waiting, kv))
            while dep._samples and dep._samples[0][0] < now - spec.look_back_period_s:
                dep._samples.popleft()
            n = len(dep._samples)
            signals = LoadSignals(
                replicas=len(live),
                ongoing_requests=sum(s[1] for s in dep._samples) / n,
                waiting_requests=sum(s[2] for s in dep._samples) / n,
                kv_cache_usage=sum(s[3] for s in dep._samples) / n,
            )
            targets = ScalingTargets(
                spec.target_ongoing_requests,
                spec.target_kv_cache_usage,
                spec.target_waiting_requests,
            )
            want, _ = desired_replicas(signals, targets)
            have = len(live) + dep.pending
            desired = min(spec.max, max(spec.min, math.ceil(want - 1e-9)))
            if desired == have:
                dep._scale_since = None
                continue
            direction = 1 if desired > have else -1
            if dep._scale_since is None or dep._scale_since[0] != direction:
                dep._scale_since = (direction, now)
            delay = spec.upscale_delay_s if direction > 0 else spec.downscale_delay_s
            if len(live) == 0 and direction > 0:
                delay = 0.0  # a request at zero replicas starts one at once (Serve)
            if now - dep._scale_since[1] < delay:
                continue
            dep._scale_since = None
            if direction > 0:
                for _ in range(min(desired - have, len(dep.spare))):
                    rs = dep.spare.pop(0)
                    dep.pending += 1
                    self._push(now + self._cold, 3, (dep, rs))
            else:
                for _ in range(have - desired):
                    victims = [e for e in dep.engines if e.active]
                    if not victims:
                        break
                    victim = min(victims, key=lambda e: e.load)
                    victim.active = False
                    dep.engines.remove(victim)
                    dep.spare.insert(0, self._setup_of(dep, victim))
            self.scale_events.append((now, dep.name, len([e for e in dep.engines if e.active])))

    @staticmethod
    def _setup_of(dep: _Deployment, engine: EngineSim) -> ReplicaSetup:
        return next(r for r in dep.setup.replicas if r.id == engine.id)

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        """Simulate until every stream is exhausted and every request finished (or the
        horizon passes: what is left then fails as timed out)."""
        for stream in self.streams:
            for _ in range(stream.concurrency or 1):
                self._send_next(stream, 0.0)
        if any(d.setup.replica_spec.max > d.setup.replica_spec.min for d in self._deps.values()):
            self._push(self._tick, 2, None)
        # The loop runs a few times per request: what it looks up per event is bound here.
        heap = self._heap
        deps = self._deps
        streams = self.streams
        sinks = self._sinks
        stream_deps = [deps[s.model] for s in streams]
        closed = [s.concurrency is not None for s in streams]
        pop, push = heapq.heappop, heapq.heappush
        horizon = self._horizon if self._horizon is not None else math.inf
        live_requests = True
        while heap:
            t, _, kind, obj, version = pop(heap)
            if t > horizon:
                self.stopped_at_horizon = True
                break
            self.now = t
            if kind == 1:
                engine: EngineSim = obj
                if engine.version != version:
                    continue  # a run cut short for a newcomer: its new end is queued
                nxt = engine.complete(t)
                if nxt is not None:
                    self._seq += 1
                    push(heap, (nxt, self._seq, 1, engine, engine.version))
                finished = engine.finished
                if finished:
                    for req in finished:
                        sinks[req.stream](req)
                        if closed[req.stream]:
                            self._send_next(streams[req.stream], t)
                    finished.clear()
                    dep = deps[engine.model]
                    if dep.queue:
                        self._drain_queue(dep, t)
            elif kind == 0:
                arrived: SimRequest = obj
                sid = arrived.stream
                if not closed[sid]:
                    self._send_next(streams[sid], t)
                self._route(stream_deps[sid], arrived, t)
            elif kind == 4:
                entering: SimRequest = obj
                engine = cast(EngineSim, entering.replica)
                nxt = engine.enter(entering, t)
                if nxt is not None:
                    self._seq += 1
                    push(heap, (nxt, self._seq, 1, engine, engine.version))
            elif kind == 2:
                self._autoscale(t)
                live_requests = any(e.load for d in deps.values() for e in d.engines) or any(
                    d.queue for d in deps.values()
                )
                if heap or live_requests:
                    self._push(t + self._tick, 2, None)
            else:
                ready, rs = obj
                ready.pending -= 1
                ready.engines.append(self._engine(ready.name, rs))
                self._drain_queue(ready, t)
        self._time_out_rest()

    def _time_out_rest(self) -> None:
        """Requests still queued or running when the simulation stopped fail as timeouts."""
        for dep in self._deps.values():
            left = list(dep.queue)
            for e in dep.engines:
                left += list(e.running) + list(e.waiting)
            for req in left:
                if req.end < 0:  # not finished nor failed (it would be in no queue then)
                    req.failed, req.end = TIMEOUT, self.now
                    self._sinks[req.stream](req)


def _least_loaded(engines: list[EngineSim], cap: int) -> EngineSim | None:
    """The active engine with the fewest ongoing requests below ``cap``, then the lowest KV
    usage, the first of equals: ``min(key=(load, kv_usage))`` over the engines with room,
    in one pass, without building their list, reading KV usage only to break a tie (the
    router's commonest call)."""
    best: EngineSim | None = None
    best_kv: float | None = None
    low = cap
    for e in engines:
        if not e.active:
            continue
        n = e.ongoing
        if n < low:
            best, low, best_kv = e, n, None
        elif n == low and best is not None:
            if best_kv is None:
                best_kv = best.kv_usage
            kv = e.kv_usage
            if kv < best_kv:
                best, best_kv = e, kv
    return best


_BLOCKS: dict[tuple[int, int, int], list[int]] = {}


def _prefix_blocks(group: int, prefix_tokens: int, block_chars: int) -> list[int]:
    """Router block hashes of a shared prefix (stable per group: equal prefixes, equal
    hashes, as the ingress's chained hashes of equal text are)."""
    key = (group, prefix_tokens, block_chars)
    found = _BLOCKS.get(key)
    if found is None:
        n = prefix_tokens * CHARS_PER_TOKEN // block_chars
        found = _BLOCKS[key] = [hash((group, i)) for i in range(n)]
    return found
