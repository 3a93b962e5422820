"""`LocalApp`: a local Ray of its own, Serve on 127.0.0.1, one Raybatch app; always torn down.

For notebooks and scripts that want the whole cluster path on one machine and
must leave nothing behind. `start()` starts a *new* local Ray (`address="local"`:
it never joins a cluster already running here, such as a test session's), Serve
on a free port of 127.0.0.1 unless one is given, and deploys the config.
`close()` deletes the app, shuts Serve down and shuts Ray down, running every
step even when an earlier one fails, once. It also runs at interpreter exit, so
a notebook whose cell failed still tears down when its kernel stops.

    with LocalApp(config, num_cpus=2) as app:
        print(app.url)                                   # http://127.0.0.1:PORT
        out = await app.handle.infer.remote("square", {"INPUT0": x})
"""

from __future__ import annotations

import atexit
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any

from cluster.config import RaybatchConfig

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_all(steps: Sequence[tuple[str, Callable[[], Any]]]) -> None:
    """Run every step in order; then raise the first failure, naming its step."""
    first: tuple[str, BaseException] | None = None
    for name, step in steps:
        try:
            step()
        except BaseException as e:  # the later steps must still run
            log.warning("teardown step %r failed: %r", name, e)
            first = first or (name, e)
    if first is not None:
        raise RuntimeError(f"teardown step {first[0]!r} failed: {first[1]!r}") from first[1]


class LocalApp:
    """A local Ray (`num_cpus`), Serve on `host:port`, and the app of `config`."""

    def __init__(self, config: RaybatchConfig, *, num_cpus: int = 2, host: str = "127.0.0.1",
                 port: int | None = None, quiet: bool = True) -> None:
        self.config = config
        self.num_cpus = num_cpus
        self.host = host
        self.port = port
        self.quiet = quiet
        self.handle: Any = None  # the ingress DeploymentHandle, once started
        self._started = False
        self._closed = False

    @property
    def url(self) -> str:
        """Where the app answers HTTP, without a trailing slash."""
        prefix = self.config.ingress.route_prefix.rstrip("/")
        return f"http://{self.host}:{self.port}{prefix}"

    def start(self) -> LocalApp:
        import ray
        from ray import serve

        from deployments.app import build_app

        if self._started:
            raise RuntimeError("a LocalApp starts once: create another one")
        self._started = True
        atexit.register(self.close)  # a failed cell stops the kernel, which runs this
        if self.port is None:
            self.port = free_port(self.host)
        if self.quiet:  # Serve logs every deployment step to the driver
            logging.getLogger("ray.serve").setLevel(logging.WARNING)
        try:
            ray.init(address="local", num_cpus=self.num_cpus, include_dashboard=False,
                     log_to_driver=not self.quiet, logging_level=logging.WARNING)
            serve.start(http_options={"host": self.host, "port": self.port})
            self.handle = serve.run(build_app(self.config), name=self.config.app_name,
                                    route_prefix=self.config.ingress.route_prefix)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Delete the app, stop Serve, stop Ray: each step runs, once."""
        if self._closed or not self._started:
            return
        self._closed = True
        atexit.unregister(self.close)
        import ray
        from ray import serve

        if not ray.is_initialized():
            return
        run_all([
            ("delete the app", lambda: serve.delete(self.config.app_name)),
            ("shut Serve down", serve.shutdown),
            ("shut Ray down", ray.shutdown),
        ])

    def __enter__(self) -> LocalApp:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
