"""Scale the OpenAI-compatible server out with Ray Serve: several replicas of ``create_app(opts)``, each a
Ray actor with its own engine (its own model copy, slots and threads), behind Ray Serve's HTTP proxy,
which sends each request to the replica with fewer requests in flight of two picked at random. Every
response names the replica that made it (``x-kwker-replica: TAG@HOST:PID``).

One machine, two engines of one core each (a local Ray instance is started and stopped with the command)::

    python -m kwker_torch.serve.ray --replicas 2 --num-cpus 1 --port 8000

Several machines: start Ray on each, then run the command on any of them with ``--address``::

    ray start --head --port 6379                  # on the head machine
    ray start --address HEAD_IP:6379              # on every other machine (same token: see below)
    python -m kwker_torch.serve.ray --address auto --replicas 4 --host 0.0.0.0

Every machine needs the same Python environment (torch, transformers, fastapi, ``ray[serve]``, the model)
and kwker_torch: installed, or this checkout at the same path (put on the replicas' ``PYTHONPATH``), or
``--ship-code``, which uploads this ``kwker_torch`` package with its built native library (so the same
torch everywhere) as the job's runtime environment. Ray 2.60 turns token authentication on for a cluster
it starts: the other machines need the head's token (``~/.ray/auth_token``, or ``RAY_AUTH_TOKEN`` /
``RAY_AUTH_TOKEN_PATH``).

Autoscaling instead of a fixed count: ``--max-replicas 4 [--min-replicas 1] [--target-ongoing-requests 8]``
(a replica is added when the requests in flight per replica stay above the target; default: ``--slots``).

Every ``ServeOptions`` field is a flag here too (``--model``, ``--precision``, ``--slots``, ...); ``--host``
and ``--port`` are where Ray Serve's proxy listens (on every machine that runs a replica, by default),
``--threads`` defaults to ``--num-cpus`` (the CPUs each replica claims from Ray). Ctrl-C (or SIGTERM)
removes the application; a Ray instance the command started is stopped with it.

From Python::

    import ray
    from ray import serve
    from kwker_torch.serve.options import ServeOptions
    from kwker_torch.serve.ray import build

    ray.init()  # ray.init(address="auto", runtime_env=code_runtime_env()) to ship the code
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    serve.run(build(ServeOptions(), replicas=2), name="kwker", route_prefix="/")

With Ray's own CLI or a Serve config file, ``app_builder`` takes the same settings as strings::

    serve run kwker_torch.serve.ray:app_builder replicas=2 slots=4

On one machine this buys nothing: two replicas of one thread serve about as fast as one of two threads,
both somewhat slower than ``python -m kwker_torch.serve`` (Ray's own processes share the cores); it is for
spreading the engines over machines.

Run as ``python -m kwker_torch.serve.ray``, never ``python kwker_torch/serve/ray.py``: the file's own folder
would come first on ``sys.path`` and this module would shadow the ``ray`` package.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import signal
import site
import socket
import sys
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

try:
    import ray
    from ray import serve
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "kwker_torch.serve.ray needs Ray Serve, which is not installed: pip install 'ray[serve]' "
        "(or use the single-process server, python -m kwker_torch.serve)"
    ) from e

from .options import ServeOptions, add_flags, from_flags

DEFAULT_APP_FACTORY = "kwker_torch.serve.app:create_app"
DEFAULT_APP_NAME = "kwker"
REPLICA_HEADER = "x-kwker-replica"
# Environment passed on to every replica as the driver has it (thread counts are set apart): no tokens, which
# would show in Ray's dashboard and state API.
FORWARDED_ENV_PREFIXES = ("KWKER_",)
FORWARDED_ENV = ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# Requests a replica takes beyond its engine's slots + queue: /health, /metrics, /v1/models while it is full.
EXTRA_ONGOING = 4


def replica_threads(num_cpus: float) -> int:
    """Kernel threads of a replica that claims ``num_cpus`` CPUs from Ray (at least one)."""
    return max(1, math.floor(num_cpus))


def _load_factory(path: str) -> Callable[[ServeOptions], Any]:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"kwker: app factory {path!r} must read 'package.module:function'")
    return getattr(importlib.import_module(module), attr)


@serve.ingress()
class KwkerReplica:
    """One Ray Serve replica: one engine, built inside the replica's process (the app, its model and its
    threads are never pickled). ``__serve_build_asgi_app__`` runs after ``__init__``; Serve then runs the
    app's lifespan (loading the model) before the replica is reported ready, and its shutdown half when the
    replica stops."""

    def __init__(self, opts: ServeOptions, app_factory: str = DEFAULT_APP_FACTORY) -> None:
        import torch

        if opts.threads > 0:
            torch.set_num_threads(opts.threads)
        self.opts = opts
        self.app_factory = app_factory

    def __serve_build_asgi_app__(self) -> Any:
        app = _load_factory(self.app_factory)(self.opts)
        tag = serve.get_replica_context().replica_tag
        app.add_middleware(ReplicaHeader, value=f"{tag}@{socket.gethostname()}:{os.getpid()}")
        return app


class ReplicaHeader:
    """ASGI middleware: every HTTP response says which replica made it, ``x-kwker-replica: TAG@HOST:PID``
    (Ray Serve's replica tag, as in its logs and ``serve status``)."""

    def __init__(self, app: Any, value: str) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.encode(), value.encode())

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_tagged(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_tagged)


def _source_root() -> str | None:
    """The folder to put on a replica's ``PYTHONPATH`` so that it imports this very kwker_torch, or None
    when kwker_torch sits in site-packages (a regular install, found by every worker anyway). A checkout
    used in place is only found from its own folder (Ray workers start elsewhere on other machines)."""
    import kwker_torch

    root = Path(kwker_torch.__file__).resolve().parent.parent
    site_dirs = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    return None if root in site_dirs else str(root)


def runtime_env(threads: int, ship_code: bool = False) -> dict[str, Any]:
    """The Ray runtime environment of every replica: thread counts fixed before torch starts (Ray itself
    sets ``OMP_NUM_THREADS`` to the actor's CPUs, 1 by default), the driver's ``KWKER_*`` settings and
    Hugging Face's offline / cache switches, and (unless ``ship_code``: the code comes with the job's
    runtime environment, ``code_runtime_env()``) this checkout of kwker_torch on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES) or k in FORWARDED_ENV}
    n = str(threads)
    env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, KWKER_NUM_THREADS=n)
    root = None if ship_code else _source_root()
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    return {"env_vars": env}


def code_runtime_env() -> dict[str, Any]:
    """``ray.init(runtime_env=...)`` that uploads this kwker_torch package (its native library included) to
    the cluster for every worker of the job, Serve replicas included. It must be the job's: Serve refuses
    local paths in a deployment's own ``runtime_env``."""
    import kwker_torch

    return {"py_modules": [str(Path(kwker_torch.__file__).resolve().parent)]}


def build(
    opts: ServeOptions,
    replicas: int = 1,
    autoscaling: dict[str, Any] | None = None,
    *,
    num_cpus: float = 1.0,
    name: str = DEFAULT_APP_NAME,
    ship_code: bool = False,
    app_factory: str = DEFAULT_APP_FACTORY,
) -> serve.Application:
    """The Ray Serve application of ``replicas`` engines (or, with ``autoscaling``, between its
    ``min_replicas`` and ``max_replicas``; ``target_ongoing_requests`` defaults to ``opts.slots``), each
    claiming ``num_cpus`` CPUs and running that many kernel threads unless ``opts.threads`` says otherwise.

    ``app_factory`` ("module:function", imported inside each replica) builds the ASGI app from ``opts``.
    ``ship_code``: the driver's ``ray.init(runtime_env=code_runtime_env())`` ships kwker_torch (else the
    replicas import this checkout, at the same path on every machine, or an installed kwker_torch).
    Pass the result to ``serve.run(app, name=..., route_prefix="/")``."""
    opts.check()
    if num_cpus <= 0:
        raise ValueError(f"kwker: num_cpus must be > 0, got {num_cpus!r}")
    threads = opts.threads if opts.threads > 0 else replica_threads(num_cpus)
    opts = dataclasses.replace(opts, threads=threads)
    scale: dict[str, Any]
    if autoscaling is not None:
        config = {"min_replicas": 1, "max_replicas": max(1, replicas), "target_ongoing_requests": opts.slots}
        config.update(autoscaling)
        scale = {"autoscaling_config": config}
    else:
        if replicas < 1:
            raise ValueError(f"kwker: replicas must be >= 1, got {replicas!r}")
        scale = {"num_replicas": replicas}
    deployment = serve.deployment(
        KwkerReplica,
        name=name,
        ray_actor_options={"num_cpus": num_cpus, "runtime_env": runtime_env(threads, ship_code)},
        # Serve's default (5 in flight per replica) would queue requests in the proxy while slots are free;
        # the engine's own queue answers 429 when it is full.
        max_ongoing_requests=opts.slots + opts.queue + EXTRA_ONGOING,
        graceful_shutdown_timeout_s=opts.shutdown_grace,
        **scale,
    )
    return deployment.bind(opts, app_factory)


def deploy_errors(name: str = DEFAULT_APP_NAME) -> str:
    """Why application ``name`` failed to deploy: Serve's messages (the replicas' tracebacks), after
    ``serve.run`` raised its bare "Failed to update the deployments"."""
    try:
        app = serve.status().applications.get(name)
    except Exception as e:  # noqa: BLE001 - a diagnostic must not hide the original error
        return f"(no Serve status: {e})"
    if app is None:
        return f"(no application {name!r} on the cluster)"
    lines = [f"application {name}: {app.status.value} {app.message}".rstrip()]
    lines += [f"deployment {d}: {s.status.value}\n{s.message}".rstrip() for d, s in app.deployments.items()]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Command line


# Where the ray command's flags mean something else than python -m kwker_torch.serve's.
OPTION_HELP = {
    "host": "where Ray Serve's proxy listens (0.0.0.0: every interface, for other machines)",
    "port": "Ray Serve's proxy port (the same on every machine that runs a proxy)",
    "threads": "kernel threads per replica (default: --num-cpus)",
}


def add_option_flags(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
    """The server's flags (``options.add_flags``), in a group of their own."""
    group = parser.add_argument_group("server options", "as for python -m kwker_torch.serve (see its --help)")
    add_flags(group, skip, OPTION_HELP)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kwker_torch.serve.ray",
        description="OpenAI-compatible kwker server scaled out over a Ray cluster with Ray Serve.",
    )
    p.add_argument(
        "--address",
        help="Ray cluster to join ('auto': the one `ray start` began here; HEAD:6379); "
        "default: start a local Ray instance for this command",
    )
    p.add_argument("--replicas", type=int, default=1, help="engines (fixed count; without --max-replicas)")
    p.add_argument("--num-cpus", type=float, default=1.0, help="CPUs each replica claims (and its kernel threads)")
    p.add_argument("--min-replicas", type=int, default=None, help="autoscaling lower bound (default 1)")
    p.add_argument("--max-replicas", type=int, default=None, help="turns autoscaling on: the upper bound")
    p.add_argument(
        "--target-ongoing-requests",
        type=float,
        default=None,
        help="autoscaling: requests in flight per replica to aim for (default: --slots)",
    )
    p.add_argument("--cluster-cpus", type=int, default=None, help="CPUs of the local Ray instance (default: all)")
    p.add_argument(
        "--proxy-location",
        default="EveryNode",
        choices=["EveryNode", "HeadOnly"],
        help="machines that run Ray Serve's HTTP proxy",
    )
    p.add_argument("--name", default=DEFAULT_APP_NAME, help="Ray Serve application (and deployment) name")
    p.add_argument(
        "--ship-code",
        action="store_true",
        help="upload this kwker_torch to the cluster (machines without the checkout)",
    )
    p.add_argument(
        "--detach", action="store_true", help="with --address: leave the application running on the cluster and exit"
    )
    p.add_argument("--dashboard", action="store_true", help="start Ray's dashboard with a local instance")
    p.add_argument(
        "--app-factory",
        default=DEFAULT_APP_FACTORY,
        help="'module:function' that builds each replica's ASGI app from ServeOptions",
    )
    add_option_flags(p)
    return p


def _autoscaling(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.max_replicas is None:
        if args.min_replicas is not None or args.target_ongoing_requests is not None:
            raise SystemExit("kwker: --min-replicas / --target-ongoing-requests need --max-replicas")
        return None
    config: dict[str, Any] = {"max_replicas": args.max_replicas}
    if args.min_replicas is not None:
        config["min_replicas"] = args.min_replicas
    if args.target_ongoing_requests is not None:
        config["target_ongoing_requests"] = args.target_ongoing_requests
    return config


def _raise_interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        opts = from_flags(args)
        app = build(
            opts,
            args.replicas,
            _autoscaling(args),
            num_cpus=args.num_cpus,
            name=args.name,
            ship_code=args.ship_code,
            app_factory=args.app_factory,
        )
    except ValueError as e:
        raise SystemExit(str(e)) from e
    if args.detach and args.address is None:
        raise SystemExit("kwker: --detach needs --address (a local Ray instance ends with this command)")

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    local = args.address is None
    job_env = code_runtime_env() if args.ship_code else None
    if local:
        # "local": never join a cluster that `ray start` left running here (ray.init() alone would).
        ray.init(address="local", num_cpus=args.cluster_cpus, include_dashboard=args.dashboard, runtime_env=job_env)
    else:
        ray.init(address=args.address, runtime_env=job_env)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        serve.start(proxy_location=args.proxy_location, http_options={"host": opts.host, "port": opts.port})
        t0 = time.perf_counter()
        try:
            serve.run(app, name=args.name, route_prefix="/")
        except RuntimeError as e:  # the replicas' tracebacks are in the deployment status, not the error
            raise SystemExit(f"kwker: {e}\n{deploy_errors(args.name)}") from e
        host = "127.0.0.1" if opts.host in ("0.0.0.0", "::") else opts.host
        print(
            f"kwker: {args.name} ready in {time.perf_counter() - t0:.1f} s at http://{host}:{opts.port}/v1 "
            f"(Ctrl-C to stop)",
            flush=True,
        )
        if args.detach:
            return
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("kwker: stopping", file=sys.stderr, flush=True)
        if not args.detach:
            if local:
                serve.shutdown()
            else:
                serve.delete(args.name)
    finally:
        ray.shutdown()


def app_builder(args: dict[str, str]) -> serve.Application:
    """For ``serve run kwker_torch.serve.ray:app_builder key=value ...`` and Serve config files: the keys
    are ServeOptions fields plus ``replicas``, ``num_cpus``, ``min_replicas``, ``max_replicas``,
    ``target_ongoing_requests``, ``name`` and ``app_factory``. ``host`` and ``port`` mean nothing here (Serve's
    own ``http_options`` do), and code is shipped with ``serve run --runtime-env-json`` or the config file's
    ``runtime_env``."""
    argv = [item for key, value in args.items() for item in ("--" + key.replace("_", "-"), str(value))]
    ns = parser().parse_args(argv)
    return build(
        from_flags(ns),
        ns.replicas,
        _autoscaling(ns),
        num_cpus=ns.num_cpus,
        name=ns.name,
        app_factory=ns.app_factory,
    )


if __name__ == "__main__":
    # Re-enter through the package so the deployment class is pickled by reference
    # (kwker_torch.serve.ray.KwkerReplica), not by value from __main__.
    from kwker_torch.serve.ray import main as _main

    _main()
