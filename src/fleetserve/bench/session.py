"""One complete ``fleetserve bench`` run: tokenizer, workload, probe, load points, token
accounting, summaries and the written outputs. The CLI is a thin shell over
:func:`run_benchmark`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path
from time import perf_counter

from rich.console import Console

from fleetserve import __version__
from fleetserve.bench.accounting import account_tokens, describe_sources
from fleetserve.bench.client import StreamingClient
from fleetserve.bench.console import error_table, live_progress, summary_table
from fleetserve.bench.lengths import LengthDistribution
from fleetserve.bench.markdown import render_markdown
from fleetserve.bench.metrics import summarize
from fleetserve.bench.probe import EndpointProbe
from fleetserve.bench.record import RequestRecord, record_to_json
from fleetserve.bench.report import BenchReport, RunInfo
from fleetserve.bench.runner import BenchRunner, RunCounters
from fleetserve.bench.settings import BenchSettings
from fleetserve.bench.tokenizer import HfTokenizer, Tokenizer, is_tokenizer_dir
from fleetserve.bench.workload import (
    PromptFileWorkload,
    SharedPrefixWorkload,
    ShareGptWorkload,
    SyntheticWorkload,
    Workload,
)
from fleetserve.errors import BenchError
from fleetserve.sampling import request_sampling

_DEFAULT_OUTPUT = LengthDistribution(kind="fixed", low=128, high=128, mean=128)
_DEFAULT_REQUESTS = 200


def load_tokenizer(settings: BenchSettings) -> Tokenizer | None:
    """``--tokenizer DIR``, else the model directory when ``--model`` is a local path."""
    if settings.tokenizer is not None:
        return HfTokenizer(settings.tokenizer)
    model_path = Path(settings.model).expanduser()
    if is_tokenizer_dir(model_path):
        return HfTokenizer(model_path)
    return None


def build_workload(settings: BenchSettings, tokenizer: Tokenizer | None) -> Workload:
    w = settings.workload
    out = w.output_len or _DEFAULT_OUTPUT
    if w.kind == "prompts":
        assert w.prompts is not None
        return PromptFileWorkload(w.prompts, out)
    if w.kind == "sharegpt":
        assert w.sharegpt is not None
        return ShareGptWorkload(w.sharegpt, tokenizer, w.output_len)
    if w.kind == "shared-prefix":
        return SharedPrefixWorkload(w.prefix_groups, w.prefix_len, w.input_len, out, tokenizer)
    return SyntheticWorkload(w.input_len, out, tokenizer)


def run_benchmark(settings: BenchSettings, console: Console | None = None) -> BenchReport:
    """Run every load point and write the requested outputs; returns the report."""
    console = console or Console(stderr=True)
    tokenizer = load_tokenizer(settings)
    workload = build_workload(settings, tokenizer)
    num_requests = settings.num_requests
    if num_requests is None and settings.duration_s is None:
        num_requests = workload.size or _DEFAULT_REQUESTS
    report = _run_async(settings, workload, tokenizer, num_requests, console)
    _write_outputs(settings, report, console)
    if report.run.interrupted:
        raise KeyboardInterrupt  # the CLI exits 130, after the report was written
    return report


def _event_loop_runner() -> asyncio.Runner:
    """uvloop when installed: less per-event overhead means less timing error."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:  # pragma: no cover - platform without uvloop
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def _run_async(
    settings: BenchSettings,
    workload: Workload,
    tokenizer: Tokenizer | None,
    num_requests: int | None,
    console: Console,
) -> BenchReport:
    with _event_loop_runner() as runner:
        return runner.run(_run(settings, workload, tokenizer, num_requests, console))


async def _run(
    settings: BenchSettings,
    workload: Workload,
    tokenizer: Tokenizer | None,
    num_requests: int | None,
    console: Console,
) -> BenchReport:
    headers = dict(settings.headers)
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key}"
    probe = await EndpointProbe(settings.base_url, settings.model, settings.endpoint, headers).run(
        settings.ignore_eos
    )
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    origin = perf_counter()
    counters = RunCounters()
    # Generated text is needed only to count tokens with the tokenizer and for --results.
    keep_text = tokenizer is not None or settings.results is not None
    client = StreamingClient(
        settings.base_url,
        settings.model,
        settings.endpoint,
        headers=settings.headers,
        api_key=settings.api_key,
        ignore_eos=probe.ignore_eos,
        extra_body=settings.extra_body,
        timeout_s=settings.timeout_s,
        origin=origin,
        keep_text=keep_text,
    )
    all_records: list[RequestRecord] = []
    interrupted = False
    per_point: list[tuple[str, float, list[RequestRecord]]] = []
    show = settings.progress and console.is_terminal
    async with client:
        runner = BenchRunner(
            client,
            workload,
            seed=settings.seed,
            warmup=settings.warmup,
            num_requests=num_requests,
            duration_s=settings.duration_s,
            counters=counters,
        )
        try:
            for point in settings.points:
                async with live_progress(counters, console, show):
                    records = await runner.run(point)
                all_records.extend(records)
                per_point.append((point.label, point.x_value, records))
                if not show:
                    done = [r for r in records if not r.warmup]
                    console.print(
                        f"[bench] {point.label}: {len(done)} requests, "
                        f"{sum(1 for r in done if not r.ok)} failed",
                        highlight=False,
                        markup=False,
                    )
        except asyncio.CancelledError:
            # Ctrl-C (asyncio.Runner cancels this task): keep what was measured, mark what
            # was in flight, write the report, then exit 130 (run_benchmark re-raises).
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            interrupted = True
            current = runner.records
            # Requests still queued behind --max-concurrency were never sent: not reported.
            partial = [r for r in current if r.start > 0 or r.e2e is not None]
            for r in partial:
                if not r.ok and r.error_type is None:
                    r.error_type, r.error = "interrupted", "still in flight at Ctrl-C"
            if partial and (not per_point or per_point[-1][2] is not current):
                all_records.extend(partial)
                point = settings.points[len(per_point)]
                per_point.append((point.label, point.x_value, partial))
            console.print("[bench] interrupted: reporting what was measured", markup=False)
    methods = account_tokens(all_records, tokenizer, chat=settings.endpoint == "chat")
    points = [summarize(label, x, recs, settings.slo) for label, x, recs in per_point]
    info = RunInfo(
        label=settings.label or settings.model,
        base_url=settings.base_url,
        model=settings.model,
        endpoint=settings.endpoint,
        workload=workload.name,
        seed=settings.seed,
        num_requests=num_requests,
        duration_s=settings.duration_s,
        warmup=settings.warmup,
        ignore_eos=probe.ignore_eos,
        ignore_eos_note=probe.ignore_eos_note,
        tokens_source=describe_sources(methods, tokenizer),
        prompt_lengths="exact (tokenizer)" if workload.exact_lengths else "approximate",
        slo=settings.slo.describe() if settings.slo else "none",
        sampling=request_sampling(settings.extra_body),
        started_at=started_at,
        monotonic_origin=origin,
        version=__version__,
        interrupted=interrupted,
    )
    report = BenchReport(run=info, points=points, records=[record_to_json(r) for r in all_records])
    if settings.results is not None:
        write_results(settings.results, all_records)
    return report


def write_results(path: Path, records: list[RequestRecord]) -> None:
    """Each prompt and its full response (seed 002's ``results.txt``). ``.jsonl`` files get
    one JSON object per request; other names get readable text blocks."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as f:
            for r in records:
                req = r.request
                prompt = "" if req is None else req.prompt
                if path.suffix == ".jsonl":
                    row = {
                        "id": r.id,
                        "point": r.point,
                        "system": None if req is None else req.system,
                        "prompt": prompt,
                        "response": r.text or "",
                        "ok": r.ok,
                        "error": r.error,
                        "start": r.start,
                        "ttft": r.ttft,
                    }
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                else:
                    status = "ok" if r.ok else f"FAILED ({r.error_type}: {r.error})"
                    f.write(f"=== request {r.id} [{r.point}] {status}\n")
                    f.write(f"Prompt: {prompt}\n")
                    f.write(f"Response: {r.text or ''}\n\n")
    except OSError as e:
        raise BenchError(f"--results {path}: cannot write: {e.strerror or e}") from e


def _write_outputs(settings: BenchSettings, report: BenchReport, console: Console) -> None:
    # The summary goes to stdout (wide enough for the table when piped), notes to stderr.
    probe = Console()
    out = probe if probe.is_terminal else Console(width=160)
    out.print(summary_table(report))
    errors = error_table(report)
    if errors is not None:
        out.print(errors)
    try:
        if settings.output is not None:
            report.save(settings.output)
            console.print(f"[bench] wrote {settings.output}", highlight=False, markup=False)
        if settings.markdown is not None:
            settings.markdown.parent.mkdir(parents=True, exist_ok=True)
            settings.markdown.write_text(render_markdown(report), encoding="utf-8")
            console.print(f"[bench] wrote {settings.markdown}", highlight=False, markup=False)
    except OSError as e:
        raise BenchError(f"cannot write report: {e.strerror or e}: {e.filename}") from e
    if settings.plots is not None:
        # matplotlib import only when asked.
        from fleetserve.bench.plots import write_plots  # noqa: PLC0415

        for path in write_plots(report, settings.plots):
            console.print(f"[bench] wrote {path}", highlight=False, markup=False)
    measured = sum(p.requests for p in report.points)
    failed = sum(p.failed for p in report.points)
    if measured and failed == measured:
        first = next((p for p in report.points if p.error_examples), None)
        example = next(iter(first.error_examples.values()), "") if first else ""
        raise BenchError(f"all {measured} requests failed; first error: {example}")
