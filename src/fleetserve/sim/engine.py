"""One simulated vLLM engine: continuous batching, step by step or a run of decode steps.

Design note - what is modelled (vLLM V1's scheduler, vllm/v1/core/sched/scheduler.py):

* each step has a token budget of ``max_num_batched_tokens``; running requests come first
  (one token per decoding sequence, the next chunk of a prompt still prefilling - chunked
  prefill), then waiting requests are admitted in arrival order while fewer than
  ``max_num_seqs`` run, the budget lasts and the KV cache has blocks for their first chunk;
* the KV cache is ``kv_blocks`` blocks of ``block_size`` tokens (from the plan's KV size); a
  running request that needs a block when none is free preempts the most recently admitted
  request (V1's recompute preemption: its blocks are freed, it goes back to the head of the
  queue and later prefills its prompt and the tokens it had generated again);
* prefix caching: a request of a shared-prefix group admitted where that group's prefix is
  cached skips those tokens (whole blocks, never the whole prompt: vLLM recomputes at least
  the last token); groups stay cached in LRU order while the blocks no running request uses
  can hold them;
* a prefill chunk that completes its prompt samples the first token in that step;
* windowed layers (Gemma 3's sliding five of six, Llama 4's chunked three of four) hold only
  their window of a sequence: vLLM frees the blocks that leave it. A block here is
  ``block_size`` tokens in every layer (vLLM's "GPU KV cache size" unit), so a sequence of
  ``c`` tokens holds ``(f c + (1 - f) min(c, window)) / block_size`` blocks, ``f`` the share of
  a token's K/V bytes in the full-attention layers; a prefill chunk also holds its own
  tokens in the windowed layers while it is computed. A decoding sequence below the window
  grows by a whole block per ``block_size`` steps, one past it by ``f`` of one (it crosses
  at a known step: runs of decode steps end there, so their growth stays exact).

**Speed: runs of decode steps.** A step-per-event simulator spends almost all its events in
long stretches where the batch is only decoding and nothing changes but context lengths.
When every running request is decoding and no waiting request could be admitted, the
engine plans a *run* of ``k`` identical decode steps - up to the first request to finish,
or as far as the free KV blocks surely last - as one event, each step timed at the run's
mean context. An arrival that could join the batch cuts the run at the next step boundary
(the steps already done are applied, the new request joins the next step), exactly as if
the steps had been simulated one by one. So events are O(requests), not O(tokens).

**Speed: decoding sequences in aggregate.** A decoding sequence changes in only one way per
step - one more token, one more position of context - so the engine keeps a decode-step
counter ``S`` and each decoding sequence only the ``S`` at which it started decoding; its
context and tokens follow from ``S``. The step's cost needs only sums over the batch (count
and total context, kept incrementally), finishing sequences come off a heap keyed by the
``S`` at which they finish, and preemption takes the most recently admitted one from an
insertion-ordered dict. A step then costs O(prefilling sequences + log batch), not
O(batch). Two aggregate approximations: KV blocks of decoding sequences are counted as
``total context / block_size`` plus half a block per sequence (the partial last blocks), and
windowed layers read ``min(mean context, window)`` per sequence.

Step times come from :class:`fleetserve.perf.EnginePerf`. Engines sharing a card take turns
on it (:meth:`EnginePerf.time_sliced`): a step (or run) waits on the turns the other engines
stepping on the card hold when it starts - the card keeps their sum (:class:`Card`). On a
CPU host each engine has its cores and the DRAM bandwidth is 1/n for the n engines
stepping when the step starts (``Hardware.shares``).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from fleetserve.perf.model import EnginePerf, LoadSums, _pairs

#: ``SimRequest.failed`` of a request the model or engine turned away (an HTTP 503) ...
REJECTED = "http_error"
#: ... and of one still queued or running when the simulation stopped.
TIMEOUT = "timeout"


@dataclass(slots=True, eq=False)
class SimRequest:
    """One request's state and the times the report is built from."""

    id: int
    stream: int
    prompt: int
    output: int
    arrival: float
    """When the client sent it (s)."""
    warmup: bool = False
    group: int = -1
    """Shared-prefix group (-1: none)."""
    prefix: int = 0
    """Tokens of the group's shared prefix."""
    scheduled: float = 0.0
    left: int = 0
    """Prompt (or recompute) tokens still to prefill."""
    ctx: int = 0
    """Tokens whose K/V are computed."""
    done: int = 0
    """Tokens generated."""
    blocks: int = 0
    first: float = -1.0
    last: float = 0.0
    end: float = -1.0
    failed: str = ""
    """Error type when the request failed (rejected: ``http_error`` 503)."""
    itl: list[float] | None = None
    replica: EngineSim | None = field(default=None, repr=False)
    base: int = 0
    """Engine decode-step counter when this request started decoding."""
    done0: int = 0
    ctx0: int = 0
    cross: int = -1
    """Decode step at which its context reaches the window (-1: none pending)."""
    mark: int = 0
    """Index in the engine's step timeline where it started decoding (ITL)."""


class Card:
    """A card (or CPU host) shared by engines: counts those stepping at a moment, and the
    turns their current steps hold on it (GPU engines)."""

    __slots__ = ("busy", "name", "turns")

    def __init__(self, name: str) -> None:
        self.name = name
        self.busy = 0
        self.turns = 0.0


class EngineSim:
    """The scheduler and timing of one engine (see the module note)."""

    __slots__ = (
        "S",
        "_below",
        "_blocks_free",
        "_cache",
        "_cross_heap",
        "_dec",
        "_dec_ctx",
        "_end",
        "_finish_heap",
        "_full",
        "_k",
        "_prefill",
        "_sched",
        "_shares",
        "_sliced",
        "_t0",
        "_tau",
        "_timeline",
        "_turn",
        "active",
        "admission_s",
        "admit_free",
        "block_size",
        "busy",
        "card",
        "finished",
        "id",
        "keep_itl",
        "kv_blocks",
        "max_seqs",
        "max_tokens",
        "model",
        "ongoing",
        "perf",
        "preemptions",
        "steps",
        "version",
        "waiting",
        "window",
    )

    def __init__(
        self,
        id: str,
        model: str,
        perf: EnginePerf,
        card: Card,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        kv_blocks: int,
        block_size: int,
        keep_itl: bool = False,
    ) -> None:
        self.id = id
        self.model = model
        self.perf = perf
        self.card = card
        self.admission_s = perf.calibration.admission_s
        self.admit_free = 0.0
        """When the replica's serving loop is done taking in the requests sent to it."""
        self.max_seqs = max_num_seqs
        self.max_tokens = max(max_num_batched_tokens, max_num_seqs)
        self.kv_blocks = max(1, kv_blocks)
        self.block_size = block_size
        self.keep_itl = keep_itl
        self.waiting: deque[SimRequest] = deque()
        self._prefill: list[SimRequest] = []
        """Admitted requests still prefilling, in admission order."""
        self._dec: dict[int, SimRequest] = {}
        """Decoding requests by id, in admission order."""
        self._dec_ctx = 0
        """Sum of (ctx0 - base) over decoding requests: total context = this + n S."""
        self._finish_heap: list[tuple[int, int, SimRequest]] = []
        self.S = 0
        self._blocks_free = float(self.kv_blocks)
        self._cache: OrderedDict[int, int] = OrderedDict()  # group -> cached prefix tokens
        cost = perf.cost
        windowed = cost.kv_window_bytes_per_token
        self.window: int | None = cost.window if cost.window is not None and windowed else None
        """Tokens a windowed layer holds of a sequence (None: every layer holds them all)."""
        self._full = (
            cost.kv_bytes_per_token / (cost.kv_bytes_per_token + windowed)
            if self.window is not None
            else 1.0
        )
        """Share of a token's K/V bytes in the full-attention layers."""
        self._below = 0
        """Decoding sequences whose context is still below the window."""
        self._cross_heap: list[tuple[int, int, SimRequest]] = []
        """(decode step at which it reaches the window, id, request) of those sequences."""
        self.busy = False
        self.active = True
        """False once autoscaling removed it (it drains, takes no new requests)."""
        self.version = 0
        self._t0 = self._tau = self._end = 0.0
        self._k = 0
        self._sched: list[tuple[SimRequest, int]] = []
        self._timeline: list[tuple[int, float, float]] = []
        """(S after, end time, step time) of every step or run (kept for ITL only)."""
        self.finished: list[SimRequest] = []
        self.steps = 0
        self.preemptions = 0
        self.ongoing = 0
        """Requests running or waiting: routers read it for every request, so it is a
        count kept where requests enter (:meth:`submit`) and leave (finished or rejected),
        not a sum of the three collections."""
        self._shares: dict[int, tuple[float, float]] = {}
        """``Hardware.shares`` by busy engines on the host (memoised: it is pure)."""
        self._sliced = not perf.hardware.cpu
        """A GPU engine: it takes turns on its card (:meth:`EnginePerf.time_sliced`)."""
        self._turn = 0.0
        """The turn this engine's current step holds on the card (in ``card.turns``)."""

    # ------------------------------------------------------------------ views

    @property
    def load(self) -> int:
        """Ongoing requests (running + waiting), what routers compare."""
        return self.ongoing

    @property
    def running(self) -> list[SimRequest]:
        return [*self._dec.values(), *self._prefill]

    @property
    def kv_usage(self) -> float:
        return 1.0 - self._blocks_free / self.kv_blocks

    def _dec_blocks(self) -> float:
        n = len(self._dec)
        return (self._dec_ctx + n * self.S) / self.block_size + 0.5 * n

    def _held(self, ctx: float, chunk: int = 0) -> float:
        """Blocks a sequence of ``ctx`` tokens holds (see the module note); ``chunk`` of
        them in flight, which the windowed layers hold besides the window before them."""
        w = self.window
        if w is None:
            return ctx / self.block_size
        f = self._full
        kept = w - 1 + chunk if chunk else w
        return (f * ctx + (1.0 - f) * (ctx if ctx < kept else kept)) / self.block_size

    def _growth(self) -> float:
        """Blocks one decode step of the decoding set adds."""
        n = len(self._dec)
        if self.window is None:
            return n / self.block_size
        f = self._full
        return (f * n + (1.0 - f) * self._below) / self.block_size

    def _cached_blocks(self, tokens: int) -> int:
        """Whole blocks a cached prefix of ``tokens`` (whole blocks of tokens) holds."""
        return math.ceil(self._held(tokens))

    def cached_blocks(self) -> int:
        """Blocks the shared prefixes cached now hold."""
        return sum(self._cached_blocks(t) for t in self._cache.values())

    def _uncross(self, r: SimRequest) -> None:
        """``r`` leaves the decoding set below the window."""
        if r.cross >= 0:
            r.cross = -1
            self._below -= 1

    # ------------------------------------------------------------------ input

    def admit(self, req: SimRequest, now: float) -> float:
        """Count ``req`` as this replica's from ``now`` and return when its serving loop,
        one request at a time, hands it to the engine (:meth:`enter` then)."""
        req.replica = self
        self.ongoing += 1
        start = now if now > self.admit_free else self.admit_free
        self.admit_free = start + self.admission_s
        return self.admit_free

    def submit(self, req: SimRequest, now: float) -> float | None:
        """Queue ``req``; returns a new event time when the engine must (re)schedule."""
        req.replica = self
        self.ongoing += 1
        return self.enter(req, now)

    def enter(self, req: SimRequest, now: float) -> float | None:
        """Queue an admitted ``req`` in the engine (as :meth:`submit`)."""
        req.left = req.prompt
        self.waiting.append(req)
        if not self.busy:
            return self._start(now)
        if self._k > 1 and len(self._dec) < self.max_seqs:
            # Cut the run of decode steps at the next boundary: the newcomer joins there.
            done = min(self._k, int((now - self._t0) / self._tau) + 1)
            if done < self._k:
                self.steps -= self._k - done
                self._k = done
                self._end = self._t0 + done * self._tau
                self.version += 1
                return self._end
        return None

    # ------------------------------------------------------------------ stepping

    def complete(self, now: float) -> float | None:
        """Apply the step (or run) ending at ``now``; start the next. Returns its end
        time, or None when the engine goes idle."""
        if self._k > 0:
            # The run's KV growth: a block per block_size tokens of every decoding sequence
            # (a single step takes its own in _schedule). _plan_run kept it within the free
            # blocks; untaken, each finished sequence gave back blocks it never took and
            # the cache grew with every run.
            self._blocks_free -= self._growth() * self._k
            self._apply_decode(self._k, now, self._tau)
            self._k = 0
        else:
            self._finish_step(now)
        return self._start(now)

    def _idle(self) -> None:
        if self.busy:
            self.busy = False
            self.card.busy -= 1
        if self._turn:
            self.card.turns -= self._turn
            self._turn = 0.0

    def _seconds(self, load: LoadSums) -> float:
        """One step's time: on a card, waiting on the other engines' turns (and holding
        its own in ``card.turns`` for theirs); on a CPU host, at its share of the DRAM
        bandwidth among the engines stepping now."""
        card = self.card
        if not self._sliced:
            shares = self._shares.get(card.busy)
            if shares is None:
                shares = self._shares[card.busy] = self.perf.hardware.shares(card.busy)
            share, compute = shares
            return self.perf.step_seconds(load, bandwidth_share=share, compute_share=compute)
        seconds, turn = self.perf.time_sliced(load, max(0.0, card.turns - self._turn))
        card.turns += turn - self._turn
        self._turn = turn
        return seconds

    def _start(self, now: float) -> float | None:
        dec = self._dec
        if not dec and not self._prefill and not self.waiting:
            self._idle()
            return None
        card = self.card
        if not self.busy:
            self.busy = True
            card.busy += 1
        self.version += 1
        run = self._plan_run()
        if run > 1:
            n = len(dec)
            ctx = (self._dec_ctx + n * self.S) / n + (run - 1) / 2
            self._tau = tau = self._seconds(self.perf.decode_load(n, ctx))
            self._k = run
            self._t0 = now
            self._end = end = now + run * tau
            self.steps += run
            return end
        self._k = 0
        self._t0 = now
        load = self._schedule()
        while load is None:  # nothing fits: the head needs more KV than the whole cache
            if dec or self._prefill or not self.waiting:
                self._idle()
                return None
            r = self.waiting.popleft()
            r.failed, r.end = REJECTED, now
            self.ongoing -= 1
            self.finished.append(r)
            load = self._schedule() if self.waiting else None
            if load is None and not self.waiting:
                self._idle()
                return None
        self.steps += 1
        self._end = end = now + self._seconds(load)
        return end

    def _plan_run(self) -> int:
        """Decode steps that will certainly be identical from now (0/1: step singly)."""
        n = len(self._dec)
        if not n or self._prefill or (self.waiting and n < self.max_seqs):
            return 0
        k = self._finish_heap[0][0] - self.S
        heap = self._cross_heap
        while heap and heap[0][2].cross != heap[0][0]:
            heapq.heappop(heap)  # stale: finished, preempted or crossed since
        if heap:
            k = min(k, heap[0][0] - self.S)  # the growth changes there
        growth = self._growth()
        by_kv = int(self._blocks_free / growth) if growth > 0 else k
        return min(k, by_kv)

    def _take(self, blocks: float) -> bool:
        """Reserve ``blocks`` KV blocks (dropping cached prefixes LRU-first if needed)."""
        if blocks > self._blocks_free:
            while self._cache and blocks > self._blocks_free:
                _, tokens = self._cache.popitem(last=False)
                self._blocks_free += self._cached_blocks(tokens)
            if blocks > self._blocks_free:
                return False
        self._blocks_free -= blocks
        return True

    def _alloc(self, req: SimRequest, tokens: int) -> bool:
        need = math.ceil(self._held(req.ctx + tokens, tokens)) - req.blocks
        if need <= 0:  # blocks that left the window are freed first
            self._blocks_free -= need
            req.blocks += need
            return True
        if not self._take(need):
            return False
        req.blocks += need
        return True

    def _preempt_last(self) -> SimRequest | None:
        """V1's recompute preemption of the most recently admitted running request."""
        if self._prefill:
            victim = self._prefill.pop()
            self._blocks_free += victim.blocks
        elif self._dec:
            victim = self._dec.pop(next(reversed(self._dec)))
            done = victim.done0 + self.S - victim.base
            ctx = victim.ctx0 + self.S - victim.base
            self._dec_ctx -= victim.ctx0 - victim.base
            self._blocks_free += self._held(ctx) + 0.5
            self._uncross(victim)
            victim.done = done
            victim.base = -1  # its heap entry is stale now
        else:
            return None
        victim.blocks = 0
        victim.ctx = 0
        victim.left = victim.prompt + victim.done  # recompute prompt + generated tokens
        self.waiting.appendleft(victim)
        self.preemptions += 1
        return victim

    def _schedule(self) -> LoadSums | None:
        budget = self.max_tokens
        # Decoding sequences: one token each, one new block per block_size steps.
        n = len(self._dec)
        while n and not self._take(self._growth()):
            self._preempt_last()
            n = len(self._dec)
        budget -= n
        sched: list[tuple[SimRequest, int]] = []
        preempted = False
        i = 0
        while i < len(self._prefill) and budget > 0:
            r = self._prefill[i]
            chunk = min(r.left, budget)
            while not self._alloc(r, chunk):
                victim = self._preempt_last()
                preempted = True
                if victim is r or victim is None:
                    break
            else:
                sched.append((r, chunk))
                budget -= chunk
                i += 1
                continue
            break
        if not preempted:
            while (
                self.waiting and len(self._dec) + len(self._prefill) < self.max_seqs and budget > 0
            ):
                r = self.waiting[0]
                if r.ctx == 0 and r.group >= 0 and r.left == r.prompt:
                    hit = self._cache.get(r.group)
                    if hit is not None:
                        self._cache.move_to_end(r.group)
                        whole = (r.prompt - 1) // self.block_size * self.block_size
                        cached = min(hit, whole)
                        r.ctx = cached
                        r.left = r.prompt - cached
                chunk = min(r.left, budget)
                if not self._alloc(r, chunk):
                    r.left, r.ctx = r.left + r.ctx, 0  # undo the cache hit; retry later
                    break
                self.waiting.popleft()
                self._prefill.append(r)
                sched.append((r, chunk))
                budget -= chunk
        self._sched = sched
        n = len(self._dec)
        if not sched and not n:
            return None
        w = self.perf.cost.window
        ctx = float(self._dec_ctx + n * self.S)
        wctx = ctx if w is None or not n else n * min(ctx / n, float(w))
        tokens, seqs, sampled = n, n, n
        pairs, wpairs = ctx + n, wctx + n
        for r, chunk in sched:
            tokens += chunk
            seqs += 1
            if r.left == chunk:
                sampled += 1
            c = r.ctx
            pairs += _pairs(chunk, c, None)
            wpairs += _pairs(chunk, c, w)
            ctx += c
            wctx += c if w is None or c < w else w
        return tokens, seqs, sampled, pairs, wpairs, ctx, wctx

    def _finish_step(self, now: float) -> None:
        tau = now - self._t0 if self._t0 < now else 0.0
        self._apply_decode(1 if self._dec else 0, now, tau)
        for r, chunk in self._sched:
            r.ctx += chunk
            r.left -= chunk
            if r.left:
                continue  # a chunk of a longer prompt: no token yet
            self._prefill.remove(r)
            r.done += 1
            if r.first < 0:
                # the loop still taking in requests sends the first token after them
                r.first = max(now, self.admit_free)
            r.last = now
            if r.done >= r.output:
                self._blocks_free += r.blocks
                r.blocks = 0
                self._finish(r, now)
                continue
            # Joins the decoding set: its blocks move into the aggregate count.
            self._blocks_free += r.blocks - (self._held(r.ctx) + 0.5)
            r.blocks = 0
            r.base, r.done0, r.ctx0 = self.S, r.done, r.ctx
            if self.window is not None and r.ctx < self.window:
                r.cross = self.S + self.window - r.ctx
                self._below += 1
                heapq.heappush(self._cross_heap, (r.cross, r.id, r))
            r.mark = len(self._timeline)
            self._dec[r.id] = r
            self._dec_ctx += r.ctx - self.S
            heapq.heappush(self._finish_heap, (self.S + r.output - r.done, r.id, r))
        self._sched = []
        self._t0 = now

    def _apply_decode(self, k: int, now: float, tau: float) -> None:
        """``k`` decode steps of the decoding set ended at ``now``."""
        if not k:
            return
        self.S += k
        if self.keep_itl:
            self._timeline.append((self.S, now, tau))
        cross = self._cross_heap
        while cross and cross[0][0] <= self.S:
            at, _, r = heapq.heappop(cross)
            if r.cross == at:  # else stale: it left the decoding set
                r.cross = -1
                self._below -= 1
        heap = self._finish_heap
        while heap and heap[0][0] <= self.S:
            at, _, r = heapq.heappop(heap)
            if r.base < 0 or at != r.base + r.output - r.done0 or r.id not in self._dec:
                continue  # preempted since it was pushed
            del self._dec[r.id]
            self._dec_ctx -= r.ctx0 - r.base
            r.done = r.done0 + self.S - r.base
            r.ctx = r.ctx0 + self.S - r.base
            self._blocks_free += self._held(r.ctx) + 0.5
            self._uncross(r)
            r.last = now
            if self.keep_itl:
                r.itl = self._gaps(r)
            self._finish(r, now)
        self._t0 = now

    def _gaps(self, r: SimRequest) -> list[float]:
        """Inter-token gaps of ``r`` from the timeline (first gap from its first token)."""
        gaps: list[float] = []
        prev_s, prev_t = r.base, r.first
        for s_after, t_end, tau in self._timeline[r.mark :]:
            if s_after <= prev_s:
                continue
            k = s_after - prev_s
            gaps.append(t_end - (k - 1) * tau - prev_t)
            gaps.extend([tau] * (k - 1))
            prev_s, prev_t = s_after, t_end
        return gaps[: max(0, r.done - 1)]

    def _finish(self, r: SimRequest, now: float) -> None:
        r.end = now
        self.ongoing -= 1
        if r.group >= 0 and r.prefix >= self.block_size:
            if r.group in self._cache:
                self._cache.move_to_end(r.group)
            else:  # the prefix's blocks stay cached (one copy per group) while room lasts
                tokens = r.prefix // self.block_size * self.block_size
                held = self._cached_blocks(tokens)
                if self._blocks_free >= held:
                    self._cache[r.group] = tokens
                    self._blocks_free -= held
        self.finished.append(r)
