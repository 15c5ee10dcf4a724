"""``fleetserve serve [SPEC]``: serve a fleet spec (or the default fleet) over HTTP."""

from __future__ import annotations

import argparse
import errno
import socket
from typing import Any

from fleetserve.engine.vllm_version import require_supported_vllm
from fleetserve.errors import UsageError
from fleetserve.serve.control.runner import FleetServer, ServeOptions
from fleetserve.spec import default_fleet, load_spec


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve the models of a fleet spec (OpenAI API on Ray Serve + vLLM)",
        description=(
            "Serve every model of SPEC (default: the built-in fleet, Gemma 3 270M) behind "
            "one OpenAI-compatible endpoint. Starts a local Ray unless --address is given. "
            "SIGTERM or Ctrl-C drains in-flight requests, then stops."
        ),
    )
    p.add_argument("spec", nargs="?", metavar="SPEC", help="fleet spec YAML file")
    p.add_argument("--host", help="bind address (default: spec server.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port (default: spec server.port, 8000)")
    p.add_argument(
        "--address",
        metavar="auto|ray://HOST:PORT",
        help="join an existing Ray cluster instead of starting one",
    )
    p.add_argument(
        "--engine",
        choices=["vllm", "fake"],
        default="vllm",
        help="inference engine; 'fake' answers without a model (smoke tests of the stack)",
    )
    p.add_argument(
        "--fake-token-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --engine fake: seconds per generated token",
    )
    p.add_argument(
        "--metrics-export-port",
        type=int,
        metavar="PORT",
        help="port of Ray's Prometheus metrics export (engine metrics as ray_vllm_*)",
    )
    p.add_argument("--verbose", action="store_true", help="show Ray's and the replicas' logs")
    p.set_defaults(handler=run)


def _check_port(host: str, port: int, option: str = "--port", hint: str = "") -> None:
    """Refuse, before Ray starts, a port this server must listen on that is out of range or
    held by another process (``option``: the flag that sets it, named in the message)."""
    if not 1 <= port <= 65535:
        raise UsageError(f"{option} {port}: must be in 1..65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UsageError(
                    f"port {port} on {host} is already in use",
                    hint=hint or f"stop the other server or pass {option}",
                ) from e
            raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e


#: Where Ray's node agent serves --metrics-export-port: every interface (its exporter's
#: address is "" unless the node's IP is a loopback one).
METRICS_EXPORT_HOST = "0.0.0.0"


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec) if args.spec else default_fleet()
    spec.require_weights("serve")  # before Ray starts: a plan-only spec has no weights
    host = args.host or spec.server.host
    port = args.port if args.port is not None else spec.server.port
    if args.fake_token_delay < 0:
        raise UsageError("--fake-token-delay must be >= 0")
    if args.engine == "vllm" and args.address is None:
        # Before Ray starts: a vLLM outside the adapter's range would fail inside a replica.
        # (A joined cluster's replicas run the cluster's vLLM: engine/vllm_api.py checks it.)
        require_supported_vllm()
    if args.address is None:
        _check_port(host, port)
        if args.metrics_export_port is not None:
            # Taken, Ray's node would time out starting (76 s, both tries) and say only that.
            _check_port(
                METRICS_EXPORT_HOST,
                args.metrics_export_port,
                "--metrics-export-port",
                hint="another Ray node or exporter holds it (a server that was just killed: "
                "its Ray may still be going); stop it or pass another --metrics-export-port",
            )
    server = FleetServer(
        ServeOptions(
            spec=spec,
            host=host,
            port=port,
            address=args.address,
            engine=args.engine,
            fake_token_delay_s=args.fake_token_delay,
            metrics_export_port=args.metrics_export_port,
            verbose=args.verbose,
        )
    )
    server.install_signal_handlers()
    try:
        server.start()
        server.wait()
    except KeyboardInterrupt:
        server.stop(drain=False)
        return 130
    except BaseException:
        server.stop(drain=False)
        raise
    server.stop(drain=True)
    return 0
