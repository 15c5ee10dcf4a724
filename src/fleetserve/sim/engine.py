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
* a prefill chunk that completes its prompt samples the first token in that step.

**Speed: runs of decode steps.** A step-per-event simulator spends almost all its events in
long stretches where the batch is only decoding and nothing changes but context lengths.
When every running request is decoding and no waiting request could be admitted, the
engine plans a *run* of ``k`` identical decode steps - up to the first request to finish,
or as far as the free KV blocks surely last - as one event, each step timed at the run's
mean context. An arrival that could join the batch cuts the run at the next step boundary
(the steps already done are applied, the new request joins the next step), exactly as if
the steps had been simulated one by one. So events are O(requests), not O(tokens).

Step times come from :class:`fleetserve.perf.EnginePerf`; the share of the card's memory
bandwidth is 1/n for the n engines stepping on the card when the step (or run) starts.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from fleetserve.perf.model import EnginePerf, StepLoad, _pairs


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


class Card:
    """A card (or CPU host) shared by engines: counts those stepping at a moment."""

    __slots__ = ("busy", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.busy = 0


class EngineSim:
    """The scheduler and timing of one engine (see the module note)."""

    __slots__ = (
        "_blocks_free",
        "_cache",
        "_cache_blocks",
        "_end",
        "_k",
        "_sched",
        "_t0",
        "_tau",
        "active",
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
        "perf",
        "preemptions",
        "running",
        "steps",
        "version",
        "waiting",
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
        self.max_seqs = max_num_seqs
        self.max_tokens = max_num_batched_tokens
        self.kv_blocks = max(1, kv_blocks)
        self.block_size = block_size
        self.keep_itl = keep_itl
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._blocks_free = self.kv_blocks
        self._cache: OrderedDict[int, int] = OrderedDict()  # group -> cached prefix blocks
        self._cache_blocks = 0
        self.busy = False
        self.active = True
        """False once autoscaling removed it (it drains, takes no new requests)."""
        self.version = 0
        self._t0 = self._tau = self._end = 0.0
        self._k = 0
        self._sched: list[tuple[SimRequest, int]] = []
        self.finished: list[SimRequest] = []
        self.steps = 0
        self.preemptions = 0

    # ------------------------------------------------------------------ views

    @property
    def load(self) -> int:
        """Ongoing requests (running + waiting), what routers compare."""
        return len(self.running) + len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self._blocks_free / self.kv_blocks

    def cached_groups(self) -> int:
        return len(self._cache)

    # ------------------------------------------------------------------ input

    def submit(self, req: SimRequest, now: float) -> float | None:
        """Queue ``req``; returns a new event time when the engine must (re)schedule."""
        req.replica = self
        req.left = req.prompt
        self.waiting.append(req)
        if not self.busy:
            return self._start(now)
        if self._k > 1 and len(self.running) < self.max_seqs:
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
            self._finish_run(now)
        else:
            self._finish_step(now)
        return self._start(now)

    def _start(self, now: float) -> float | None:
        if not self.running and not self.waiting:
            if self.busy:
                self.busy = False
                self.card.busy -= 1
            return None
        if not self.busy:
            self.busy = True
            self.card.busy += 1
        self.version += 1
        share = 1.0 / self.card.busy
        run = self._plan_run()
        if run > 1:
            batch = len(self.running)
            ctx = sum(r.ctx for r in self.running) / batch + (run - 1) / 2
            self._tau = self.perf.decode_step_time(batch, ctx, bandwidth_share=share)
            self._k = run
            self._t0 = now
            self._end = now + run * self._tau
            self.steps += run
            return self._end
        self._k = 0
        load = self._schedule()
        self.steps += 1
        while load is None:  # nothing fits: the head needs more KV than the whole cache
            if self.running or not self.waiting:
                self.busy = False
                self.card.busy -= 1
                return None
            r = self.waiting.popleft()
            r.failed, r.end = "http_error", now
            self.finished.append(r)
            if not self.waiting:
                self.busy = False
                self.card.busy -= 1
                return None
            load = self._schedule()
        self._end = now + self.perf.step_time(load, bandwidth_share=share)
        return self._end

    def _plan_run(self) -> int:
        """Decode steps that will certainly be identical from now (0/1: step singly)."""
        running = self.running
        if not running or (self.waiting and len(running) < self.max_seqs):
            return 0
        bs = self.block_size
        k = 1 << 30
        slack = 1 << 30
        for r in running:
            if r.left:
                return 0
            k = min(k, r.output - r.done)
            slack = min(slack, r.blocks * bs - r.ctx)
        if len(running) > self.max_tokens:
            return 0
        by_kv = (self._blocks_free // len(running)) * bs + slack
        return min(k, by_kv)

    def _alloc(self, req: SimRequest, tokens: int) -> bool:
        need = -(-(req.ctx + tokens) // self.block_size) - req.blocks
        if need <= 0:
            return True
        if need > self._blocks_free:
            self._evict(need - self._blocks_free)
            if need > self._blocks_free:
                return False
        self._blocks_free -= need
        req.blocks += need
        return True

    def _evict(self, blocks: int) -> None:
        """Drop cached prefixes (LRU first) until ``blocks`` more are free or none is left."""
        while blocks > 0 and self._cache:
            _, held = self._cache.popitem(last=False)
            self._cache_blocks -= held
            self._blocks_free += held
            blocks -= held

    def _preempt(self, victim: SimRequest) -> None:
        self.running.remove(victim)
        self._blocks_free += victim.blocks
        victim.blocks = 0
        victim.ctx = 0
        victim.left = victim.prompt + victim.done  # recompute prompt + generated tokens
        self.waiting.appendleft(victim)
        self.preemptions += 1

    def _schedule(self) -> StepLoad | None:
        budget = self.max_tokens
        sched: list[tuple[SimRequest, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            n = min(r.left, budget) if r.left else 1
            while not self._alloc(r, n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is r:
                    break
            else:
                sched.append((r, n))
                budget -= n
                i += 1
                continue
            break  # r itself was preempted: it was the last one
        if not preempted:
            while self.waiting and len(self.running) < self.max_seqs and budget > 0:
                r = self.waiting[0]
                if r.ctx == 0 and r.group >= 0 and r.left == r.prompt:
                    hit = self._cache.get(r.group)
                    if hit is not None:
                        self._cache.move_to_end(r.group)
                        whole = (r.prompt - 1) // self.block_size * self.block_size
                        cached = min(hit * self.block_size, whole)
                        r.ctx = cached
                        r.left = r.prompt - cached
                n = min(r.left, budget)
                if not self._alloc(r, n):
                    r.left, r.ctx = r.left + r.ctx, 0  # undo the cache hit; retry later
                    break
                self.waiting.popleft()
                self.running.append(r)
                sched.append((r, n))
                budget -= n
        self._sched = sched
        if not sched:
            return None
        w = self.perf.cost.window
        tokens = seqs = sampled = 0
        pairs = wpairs = ctx = wctx = 0.0
        for r, n in sched:
            tokens += n
            seqs += 1
            if r.left == n:
                sampled += 1
            c = r.ctx
            if n == 1:
                pairs += c + 1
                wpairs += c + 1 if w is None or c < w else w
            else:
                pairs += _pairs(n, c, None)
                wpairs += _pairs(n, c, w)
            ctx += c
            wctx += c if w is None or c < w else w
        return StepLoad(tokens, seqs, sampled, pairs, wpairs, ctx, wctx)

    def _finish_step(self, now: float) -> None:
        keep = self.keep_itl
        for r, n in self._sched:
            r.ctx += n
            if r.left:
                r.left -= n
                if r.left:
                    continue  # a chunk of a longer prompt: no token yet
            r.done += 1
            if r.first < 0:
                r.first = now
            elif keep:
                if r.itl is None:
                    r.itl = []
                r.itl.append(now - r.last)
            r.last = now
            if r.done >= r.output:
                self._finish(r, now)
        self._sched = []

    def _finish_run(self, now: float) -> None:
        k, tau = self._k, self._tau
        self._k = 0
        keep = self.keep_itl
        bs = self.block_size
        for r in list(self.running):
            if keep:
                if r.itl is None:
                    r.itl = []
                r.itl.append(self._t0 + tau - r.last)
                r.itl.extend([tau] * (k - 1))
            r.ctx += k
            r.done += k
            r.last = now
            need = -(-r.ctx // bs) - r.blocks
            if need > 0:
                self._blocks_free -= need
                r.blocks += need
            if r.done >= r.output:
                self._finish(r, now)

    def _finish(self, r: SimRequest, now: float) -> None:
        self.running.remove(r)
        r.end = now
        freed = r.blocks
        r.blocks = 0
        if r.group >= 0 and r.prefix >= self.block_size:
            if r.group in self._cache:
                self._cache.move_to_end(r.group)
            else:  # the prefix's blocks stay cached (one copy per group)
                held = min(r.prefix // self.block_size, freed)
                self._cache[r.group] = held
                self._cache_blocks += held
                freed -= held
        self._blocks_free += freed
        self.finished.append(r)
