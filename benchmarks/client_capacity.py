"""Client capacity: the highest load ``fleetserve bench`` sustains with correct timing,
side by side with vLLM's own client (``vllm bench serve``) in the same run.

Design:

* The target is an "infinitely fast" OpenAI streaming server in its own process (``--serve``):
  a raw asyncio protocol on uvloop that answers every completion request at once with
  pre-built SSE bytes (one event per token, a usage event, ``[DONE]``). Its true TTFT is the
  loopback round trip (tens of microseconds), so a client's *measured* TTFT is an upper bound
  of its own timing error. The server writes its clock (``perf_counter_ns``, the same
  CLOCK_MONOTONIC the clients read) into the first token's text, which splits the error into
  send side (client start -> server write) and receive side (server write -> client's
  first-token timestamp).
* Both clients run as separate processes, the way users run them, one after the other at
  each offered rate (order alternating per rate, to cancel drift on a shared
  machine), with the same request count, warm-up, input and output lengths.
* A rate is *sustained* when the achieved request rate is >= 95 % of the offered rate and the
  measured TTFT p50 is < 1 ms. Capacity = highest sustained rate; streamed tokens/s = achieved
  requests/s x output tokens. The tables also give the highest rate kept up with at any
  timing error, since a client can keep the rate while its timestamps are already late.

Run: ``.venv/bin/python benchmarks/client_capacity.py`` (20-30 minutes on 2 shared cores;
``--tables-from rows.json`` reprints the tables of a run saved with ``--json``).
``--tokenizer DIR`` is the tokenizer vLLM's client needs to build prompts (default: the
fleetserve default model dir; a small local tokenizer is built when it is missing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

from fleetserve.serve.control.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
DEFAULT_TOKENIZER = Path.home() / ".cache/fleetserve/models/gemma-3-270m"
MODEL = "capacity-model"
TS_DIGITS = 19
#: Gamma shape of the arrival gaps, same convention in both clients. Near-constant gaps: with
#: Poisson arrivals the realised rate of a finite run is itself off by ~1/sqrt(n), which would
#: blur the "kept up with the offered rate" test.
BURSTINESS = 1000

# ----------------------------------------------------------------------------- the server


def _sse_response(n_tokens: int, chat: bool) -> tuple[bytes, bytes]:
    """HTTP response split around the first token's timestamp placeholder."""
    events: list[bytes] = []
    for i in range(n_tokens):
        text = "\x00TS\x00" if i == 0 else " x"
        if chat:
            choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
            obj = "text_completion"
        if i == n_tokens - 1:
            choice["finish_reason"] = "length"
        event = {"id": "cmpl-x", "object": obj, "created": 0, "model": MODEL, "choices": [choice]}
        events.append(b"data: " + json.dumps(event).encode() + b"\n\n")
    usage = {"prompt_tokens": 32, "completion_tokens": n_tokens, "total_tokens": 32 + n_tokens}
    events.append(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    placeholder = json.dumps("\x00TS\x00")[1:-1].encode()  # as escaped inside the JSON
    # Chunked transfer encoding, one HTTP chunk per SSE event, as vLLM's server sends them;
    # the first chunk's size counts the timestamp that replaces the placeholder.
    grow = TS_DIGITS - len(placeholder)
    body = b"".join(b"%x\r\n%s\r\n" % (len(e) + grow if i == 0 else len(e), e)
                    for i, e in enumerate(events)) + b"0\r\n\r\n"  # fmt: skip
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    before, after = (head + body).split(placeholder, 1)
    return before, after


def _plain(status: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


MODELS = _plain("200 OK", json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode())
NOT_FOUND = _plain("404 Not Found", b'{"error":{"message":"not found"}}')
ONE_SHOT = _plain("200 OK", b'{"id":"x","choices":[{"index":0,"text":"x","message":{"role":'
                  b'"assistant","content":"x"},"finish_reason":"length"}]}')  # fmt: skip


class FastSse(asyncio.Protocol):
    """Answers each request on arrival; nothing is formatted per request but the timestamp."""

    cache: dict[tuple[int, bool], tuple[bytes, bytes]] = {}  # noqa: RUF012

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport  # uvloop's TCPTransport is not an asyncio.Transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at)
                length = int(head[at + 15 : stop if stop > 0 else None])
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self.respond(head, body)

    def respond(self, head: bytes, body: bytes) -> None:
        if head.startswith(b"get /v1/models"):
            self.transport.write(MODELS)
            return
        if not head.startswith(b"post /v1/"):
            self.transport.write(NOT_FOUND)
            return
        req = json.loads(body)
        if not req.get("stream"):
            self.transport.write(ONE_SHOT)
            return
        key = (int(req.get("max_tokens") or 16), b"/chat/" in head[:40])
        parts = self.cache.get(key)
        if parts is None:
            parts = self.cache[key] = _sse_response(*key)
        before, after = parts
        stamp = b"%019d" % time.perf_counter_ns()
        self.transport.write(before + stamp + after)


def serve(port: int) -> None:
    import uvloop  # noqa: PLC0415 - the server process needs nothing else

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(FastSse, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


# ----------------------------------------------------------------------------- the clients

VLLM_RUNNER = """
import sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
if __name__ == "__main__":
    p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))
"""


def _ts(text: str) -> float | None:
    digits = text[:TS_DIGITS]
    return int(digits) / 1e9 if len(digits) == TS_DIGITS and digits.isdigit() else None


def run_fleetserve(
    url: str, rate: float, n: int, warmup: int, out_len: int, work: Path
) -> dict[str, Any]:
    out, rows = work / "fs.json", work / "fs.jsonl"
    cmd = [PY, "-m", "fleetserve.cli", "bench", "--base-url", url, "--model", MODEL,
           "--endpoint", "completions", "--rate", f"{rate:g}", "--arrival", "gamma",
           "--burstiness", str(BURSTINESS), "--num-requests", str(n),
           "--warmup", str(warmup), "--input-len", "32", "--output-len", str(out_len),
           "--no-progress", "--output", str(out), "--results", str(rows)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    report = json.loads(out.read_text())
    origin = report["run"]["monotonic_origin"]
    texts = {}
    for line in rows.read_text().splitlines():
        row = json.loads(line)
        texts[row["id"]] = row["response"]
    recs = [r for r in report["records"] if not r["warmup"]]
    ok = [r for r in recs if r["ok"]]
    starts = [origin + r["start"] for r in ok]
    ends = [origin + r["start"] + r["e2e"] for r in ok]
    p = report["points"][0]
    return _stats(
        offered=rate,
        achieved=len(ok) / (max(ends) - min(starts)),
        ttfts=[r["ttft"] for r in ok],
        starts=starts,
        server_ts=[_ts(texts[r["id"]]) for r in ok],
        failed=len(recs) - len(ok),
        send_lag_p50_ms=p["send_lag"]["p50"],
        tokens=sum(r["tokens_out"] or 0 for r in ok),
    )


def run_vllm(url: str, rate: float, n: int, warmup: int, out_len: int, work: Path,
             tokenizer: Path) -> dict[str, Any]:  # fmt: skip
    name = "vllm.json"
    cmd = [PY, "-c", VLLM_RUNNER, "--backend", "openai", "--endpoint", "/v1/completions",
           "--base-url", url, "--model", MODEL, "--tokenizer", str(tokenizer),
           "--dataset-name", "random", "--random-input-len", "32",
           "--random-output-len", str(out_len), "--num-prompts", str(n),
           "--request-rate", f"{rate:g}", "--burstiness", str(BURSTINESS),
           "--ignore-eos", "--num-warmups", str(warmup),
           "--seed", "0", "--save-result", "--save-detailed", "--result-dir", str(work),
           "--result-filename", name, "--disable-tqdm",
           "--ready-check-timeout-sec", "0"]  # fmt: skip
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=work)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{proc.stderr[-3000:]}")
    res = json.loads((work / name).read_text())
    ok = [i for i, e in enumerate(res["errors"]) if not e]
    starts = [res["start_times"][i] for i in ok]
    ends = [res["start_times"][i] + res["latencies"][i] for i in ok]
    return _stats(
        offered=rate,
        achieved=len(ok) / (max(ends) - min(starts)),
        ttfts=[res["ttfts"][i] for i in ok],
        starts=starts,
        server_ts=[_ts(res["generated_texts"][i]) for i in ok],
        failed=len(res["errors"]) - len(ok),
        send_lag_p50_ms=None,
        tokens=sum(res["output_lens"][i] for i in ok),
    )


def _stats(*, offered: float, achieved: float, ttfts: list[float], starts: list[float],
           server_ts: list[float | None], failed: int, send_lag_p50_ms: float | None,
           tokens: int) -> dict[str, Any]:  # fmt: skip
    send = [s - st for s, st in zip(server_ts, starts, strict=True) if s is not None]
    recv = [st + t - s for s, st, t in zip(server_ts, starts, ttfts, strict=True) if s is not None]
    ttft = np.asarray(ttfts) * 1e3
    return {
        "offered": offered,
        "achieved": achieved,
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_p99_ms": float(np.percentile(ttft, 99)),
        "send_p50_ms": median(send) * 1e3 if send else None,
        "recv_p50_ms": median(recv) * 1e3 if recv else None,
        "send_lag_p50_ms": send_lag_p50_ms,
        "failed": failed,
        "tokens_per_s": achieved * tokens / max(len(ttfts), 1),
        "sustained": achieved >= 0.95 * offered and float(np.percentile(ttft, 50)) < 1.0,
    }


# ----------------------------------------------------------------------------- driver


def ensure_tokenizer(path: Path | None, work: Path) -> Path:
    if path is not None:
        return path
    if (DEFAULT_TOKENIZER / "tokenizer.json").exists():
        return DEFAULT_TOKENIZER
    # Only when no tokenizer is at hand (slow imports).
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    words = json.loads((ROOT / "src/fleetserve/bench/data/words.json").read_text())["words"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(words)] * 4, trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<unk>", "<eos>"]))  # fmt: skip
    out = work / "tokenizer"
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>"
    ).save_pretrained(out)
    return out


def sweep(label: str, rates: list[float], n: int, warmup: int, out_len: int, url: str,
          tokenizer: Path, work: Path) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    for k, rate in enumerate(rates):
        order = ["fleetserve", "vllm"] if k % 2 == 0 else ["vllm", "fleetserve"]
        for client in order:
            if client == "fleetserve":
                row = run_fleetserve(url, rate, n, warmup, out_len, work)
            else:
                row = run_vllm(url, rate, n, warmup, out_len, work, tokenizer)
            row.update(client=client, scenario=label, output_len=out_len)
            rows.append(row)
            print(
                f"{label:>8} {client:>10} offered {rate:7.0f}/s achieved {row['achieved']:7.1f}/s "
                f"TTFT p50 {row['ttft_p50_ms']:6.2f} ms p99 {row['ttft_p99_ms']:7.2f} ms "
                f"(send {row['send_p50_ms'] or 0:.2f} + recv {row['recv_p50_ms'] or 0:.2f}) "
                f"{row['tokens_per_s']:9.0f} tok/s {'OK' if row['sustained'] else '--'}",
                flush=True,
            )
    return rows


def capacity(
    rows: list[dict[str, Any]], client: str, scenario: str, *, timed: bool
) -> dict[str, Any] | None:
    """Highest offered rate the client kept up with (achieved >= 95 %); with ``timed``, also
    with TTFT p50 < 1 ms (its timing still correct)."""
    ok = [
        r
        for r in rows
        if r["client"] == client
        and r["scenario"] == scenario
        and r["achieved"] >= 0.95 * r["offered"]
        and (r["sustained"] or not timed)
    ]
    return max(ok, key=lambda r: r["offered"]) if ok else None


def summary(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | client | highest rate, timing correct (req/s) | streamed tok/s "
        "| TTFT p50 there (ms) | highest rate kept up with, any timing (req/s) "
        "| TTFT p50 there (ms) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for scenario in ("requests", "tokens"):
        for client in ("fleetserve", "vllm"):
            timed = capacity(rows, client, scenario, timed=True)
            loose = capacity(rows, client, scenario, timed=False)
            cells = [scenario, client]
            if timed is None:
                cells += ["none of the rates tried", "-", "-"]
            else:
                cells += [f"{timed['offered']:.0f}", f"{timed['tokens_per_s']:.0f}",
                          f"{timed['ttft_p50_ms']:.2f}"]  # fmt: skip
            if loose is None:
                cells += ["none of the rates tried", "-"]
            else:
                cells += [f"{loose['offered']:.0f}", f"{loose['ttft_p50_ms']:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_rate(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | offered req/s | client | achieved req/s | TTFT p50 (ms) "
        "| send + recv p50 (ms) | TTFT p99 (ms) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["scenario"] != "requests", r["offered"], r["client"])):
        lines.append(
            f"| {r['scenario']} ({r['output_len']} tok) | {r['offered']:.0f} | {r['client']} | "
            f"{r['achieved']:.1f} | {r['ttft_p50_ms']:.2f} | "
            f"{r['send_p50_ms'] or 0:.2f} + {r['recv_p50_ms'] or 0:.2f} | {r['ttft_p99_ms']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--rates", default="250,500,750,1000,1500,2000", help="short-output sweep")
    ap.add_argument("--token-rates", default="50,100,150,200,300", help="long-output sweep")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--long-output-len", type=int, default=256)
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--json", type=Path, help="write all rows here")
    ap.add_argument("--tables-from", type=Path, metavar="JSON", help="only print the tables")
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.tables_from:
        rows = json.loads(args.tables_from.read_text())
        print(summary(rows) + "\n\n" + per_rate(rows))
        return
    port = free_port()
    server = subprocess.Popen([PY, __file__, "--serve", str(port)], start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            tokenizer = ensure_tokenizer(args.tokenizer, work)
            rates = [float(r) for r in args.rates.split(",")]
            token_rates = [float(r) for r in args.token_rates.split(",")]
            load = os.getloadavg()[0]
            print(f"# load average {load:.1f}, {os.cpu_count()} cpus; tokenizer {tokenizer}")
            rows = sweep("requests", rates, args.requests, args.warmup, args.output_len, url,
                         tokenizer, work)  # fmt: skip
            rows += sweep("tokens", token_rates, args.requests // 4, args.warmup,
                          args.long_output_len, url, tokenizer, work)  # fmt: skip
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(10)
    print("\n" + summary(rows) + "\n\n" + per_rate(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
