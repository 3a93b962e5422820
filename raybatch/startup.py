"""How `raybatch up` deploys and stops where the user can see it and interrupt it.

Deploying: Serve is asked to run the app without blocking, and its status is polled,
with the actors Ray has not placed or started yet (read from the GCS: their class, the
resources they ask for, whether a process runs them, and what Ray holds queued for want of
resources), so the user sees what is pending and why: waiting for resources (what is
asked, what is free), starting a process (Ray starts a few at a time), or
initialising (the model's setup and warm-up run in the replica's constructor). On a TTY
the view is redrawn in place; otherwise a line is printed when it changes.

Stopping: the first Ctrl-C (SIGINT; SIGTERM and SIGHUP too) asks to stop; the app is
deleted, its requests in flight finish, and what takes longer than a few seconds is
named. A local run stops everything after `ingress.stop_timeout_s` whatever is left; a
second Ctrl-C kills this run's processes (`raybatch.runs`) and exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, NoReturn

from cluster.demands import bundle_key, waiting_demands
from raybatch import runs

POLL_S = 0.5
MODEL_REPLICAS = ("ModelReplica", "SequenceReplica", "StepReplica")
NOTE_EVERY_S = 3.0


class Stopper:
    """Ctrl-C once: `requested` is set; twice: the run is killed and the process exits."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.run: runs.Run | None = None

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.requested.is_set():
            self.now()
        self.requested.set()
        print("\nstopping (Ctrl-C again to stop at once)", flush=True)

    def now(self) -> NoReturn:
        """Kill this run's processes (a local Ray, HAProxy) and exit 130 at once."""
        print("\nstopping at once: ending this run's processes", flush=True)
        if self.run is not None:
            runs.kill_now(self.run.run_id)
            self.run.forget()
        os._exit(130)


def start_local_ray(init: Any, stopper: Stopper, **options: Any) -> None:
    """`init(**options)` (`ray.init` for a new local node), tried again while Ray's node
    does not register in time (`cluster.localray`: up to its TRIES, what a failed try
    started ended before the next, and this run's processes too); the user is told. After
    Ctrl-C no other try is made."""
    from cluster.localray import start_local

    def end_run() -> None:
        if stopper.run is not None:
            runs.end_run(stopper.run.run_id, grace_s=1.0)

    start_local(init, again=lambda: not stopper.requested.is_set(),
                say=lambda what: print(f"note: {what}", flush=True), ended=end_run,
                **options)


def fits_cluster(config: Any, local: bool) -> bool:
    """Whether the config's minimum fits the cluster (`cluster.fit`); a local Ray cannot
    grow, so it is refused there; a cluster may (an autoscaler), so it is told."""
    import sys

    import ray

    from cluster.fit import check_fit
    from cluster.modelpath import ConfigError

    try:
        check_fit(config, [n["Resources"] for n in ray.nodes() if n.get("Alive")])
    except ConfigError as e:
        if local:
            print(f"raybatch up: {e}", file=sys.stderr, flush=True)
            return False
        print(f"note: {e}\nwaiting for the cluster to grow (an autoscaler adds nodes); "
              "Ctrl-C stops", flush=True)
    return True


def fits_as_asked(config: Any, num_cpus: float | None, num_gpus: float | None) -> bool:
    """Whether the config's minimum fits the CPUs and GPUs given to a local Ray
    (`--num-cpus`, `--num-gpus`), known before it starts; what Ray would find itself
    is checked once it runs (`fits_cluster`)."""
    import sys

    from cluster.fit import Need, minimum_demand, refusal, shortfall

    given = {k: float(v) for k, v in (("CPU", num_cpus), ("GPU", num_gpus))
             if v is not None}
    needs = [Need(x.what, x.count, {k: v for k, v in x.each.items() if k in given})
             for x in minimum_demand(config)]
    problems = shortfall([x for x in needs if x.each], [given])
    if problems:
        print(f"raybatch up: {refusal(problems)}", file=sys.stderr, flush=True)
    return not problems


def deploy(app: Any, name: str, route_prefix: str, stopper: Stopper) -> str:
    """Start deploying `app`, show what is pending until it runs; returns "running",
    "stopped" (Ctrl-C) or the reason it failed (Serve's messages): at Serve's DEPLOY_FAILED,
    or at the first of Raybatch's own deploy errors (`DEPLOY_ERRORS`)."""
    from ray import serve
    from ray.serve.api import _run  # serve.run without waiting for the app to run

    _run(app, _blocking=False, name=name, route_prefix=route_prefix)
    view = ProgressView(sys.stdout)
    started = time.monotonic()
    while not stopper.requested.wait(POLL_S):
        state = serve.status().applications.get(name)
        status = str(getattr(state, "status", "DEPLOYING"))
        status = status.rsplit(".", 1)[-1]
        if status == "RUNNING":
            view.done(f"deployed in {time.monotonic() - started:.1f} s")
            return "running"
        failed = failure(state, status)
        if failed is not None:
            view.done("")
            return failed
        view.show(time.monotonic() - started, pending_lines(state))
    view.done("")
    return "stopped"


ROUTE_WAIT_S = 60.0


def reachable(host: str) -> str:
    """`host` as this machine reaches a server bound to it: a wildcard (all addresses)
    through 127.0.0.1, an IPv6 address in brackets."""
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def wait_routed(url: str, stopper: Stopper, timeout_s: float = ROUTE_WAIT_S) -> bool:
    """Wait until `url` (the app's readiness route through Serve's HTTP port) answers 200:
    Serve calls an app RUNNING before its proxy routes the app's prefix, and on a busy
    machine a request sent at once was answered 404. Says what it waits for past
    NOTE_EVERY_S; past `timeout_s` it says so and returns False (the app does run)."""
    import urllib.error
    import urllib.request

    # straight to this machine: a user's http_proxy would otherwise carry 127.0.0.1 away
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    started = time.monotonic()
    note_at, last = started + NOTE_EVERY_S, "no answer"
    while not stopper.requested.is_set():
        try:
            with opener.open(url, timeout=2.0) as r:
                if r.status == 200:
                    return True
                last = f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except OSError as e:
            last = type(e).__name__
        now = time.monotonic()
        if now - started > timeout_s:
            print(f"note: {url} still answers {last} after {timeout_s:g} s; Serve's HTTP "
                  "proxy may not route the app yet", flush=True)
            return False
        if now >= note_at:
            print(f"waiting for Serve's HTTP proxy to route the app ({url}: {last})",
                  flush=True)
            note_at = now + NOTE_EVERY_S
        stopper.requested.wait(0.1)
    return False


# Raybatch's own deploy errors: a replica that cannot build its model or does not fit its
# tensors, a config refused. The same code and config fail the same way again, so `up`
# says so at the first, where Serve would start the replica twice more first.
DEPLOY_ERRORS = ("ReplicaSetupError: ", "ConfigError: ")


def failure(state: Any, status: str) -> str | None:
    """Serve's messages once a deploy in `status` has failed (DEPLOY_FAILED, or one of
    `DEPLOY_ERRORS` while Serve still retries); None while it may yet run. As `serve.run`,
    an unhealthy replica is not a failure: it is replaced."""
    messages = [getattr(state, "message", "") or "",
                *(d.message or "" for d in (getattr(state, "deployments", None) or {}).values())]
    ours = any(mark in m for m in messages for mark in DEPLOY_ERRORS)
    if status == "DEPLOY_FAILED" or ours:
        return "\n".join(m for m in messages if m) or status
    return None


def deploy_error(text: str) -> str:
    """The reason in a Serve deploy failure: Raybatch's own error line when it has one
    (a replica that cannot build its model or does not fit its tensors), else the text."""
    lines = [line.split(mark, 1)[1] for line in text.splitlines() for mark in DEPLOY_ERRORS
             if mark in line]
    return lines[-1] if lines else text


def pending_lines(app_state: Any) -> list[str]:
    """What is not running yet: each deployment not healthy (its replicas by state) and
    each actor Ray has not finished creating, with why."""
    lines = []
    for name, d in (getattr(app_state, "deployments", None) or {}).items():
        healthy = str(d.status).rsplit(".", 1)[-1] == "HEALTHY"
        if healthy and set(d.replica_states) <= {"RUNNING"}:
            continue
        states = ", ".join(f"{n} {s.lower()}" for s, n in sorted(d.replica_states.items()))
        lines.append(f"  {name}: {states or 'no replicas yet'}")
    free, waiting = _free_resources(), waiting_demands()
    reasons = [f"{actor['label']}: {why_pending(actor, free, waiting)}"
               for actor in pending_actors()]
    for reason in dict.fromkeys(reasons):  # in order, each once, with its count
        n = reasons.count(reason)
        lines.append(f"  {reason}" if n == 1 else f"  {n} x {reason}")
    return lines


def pending_actors(states: tuple[str, ...] = ("PENDING_CREATION", "DEPENDENCIES_UNREADY",
                                              "RESTARTING"),
                   prefix: str = "") -> list[dict[str, Any]]:
    """Actors in one of `states` (by default: not created yet), read from the GCS, with
    the resources they ask for; only those whose class name starts with `prefix`."""
    from ray._private import state
    from ray.core.generated import gcs_pb2

    names = gcs_pb2.ActorTableData.ActorState.Name
    try:
        accessor = state.state._connect_and_get_accessor()
        table = accessor.get_actor_table(None, None)
    except Exception:  # the view is best effort; deploying goes on without it
        return []
    found = []
    for raw in table:
        a = gcs_pb2.ActorTableData.FromString(raw)
        if names(a.state) in states and a.class_name.startswith(prefix):
            kind, _, rest = a.class_name.partition(":")  # ServeReplica:app:deployment
            label = f"{rest.rpartition(':')[2]} replica" if kind == "ServeReplica" else kind
            found.append({"label": label, "pid": a.pid,
                          "resources": {k: v for k, v in a.required_resources.items()
                                        if v and k != "memory"}})
    return found


def stopping_lines(app_name: str, app_state: Any) -> list[str]:
    """What a deleting app still waits for: its deployments' replicas, and the Serve
    replicas of the app that are still alive (finishing their requests in flight)."""
    alive = pending_actors(("ALIVE",), prefix=f"ServeReplica:{app_name}:")
    status = str(getattr(app_state, "status", "")).rsplit(".", 1)[-1]
    return [f"app {app_name} {status.lower()}".rstrip(), *pending_lines(app_state),
            *(f"{a['label']} (pid {a['pid']}) finishing its requests in flight"
              for a in alive)]


def why_pending(actor: dict[str, Any], free: dict[str, float],
                waiting: dict[tuple, int] | None = None) -> str:
    """Why `actor` is not created yet. `waiting`: what Ray holds queued for want of
    resources (`waiting_demands`), each bundle with a count, taken from as actors without
    a process are matched to it. Ray takes an actor's resources before it starts its
    process, so an actor whose process is starting asks more than is free too, and only
    Ray's queue tells the two apart; where Ray did not say (None), asking more than is free
    counts as waiting."""
    asks = actor["resources"]
    short = {k: v for k, v in asks.items() if free.get(k, 0.0) + 1e-9 < v}
    if waiting is not None:  # an actor a process runs has its resources: never queued
        key = bundle_key(asks)
        queued = bool(asks) and not actor["pid"] and waiting.get(key, 0) > 0
        if queued:
            waiting[key] -= 1
        short = (short or asks) if queued else {}
    if short:
        return ("waiting for resources: asks " + _fmt(asks) + ", free "
                + _fmt({k: free.get(k, 0.0) for k in short}))
    if not actor["pid"]:
        return "starting a process" + (f" ({_fmt(asks)})" if asks else "")
    if actor["label"] in MODEL_REPLICAS:  # its constructor builds the model and warms it up
        return "initialising (model setup, then warm-up)"
    return "initialising"


def _fmt(resources: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items())) or "nothing"


def _free_resources() -> dict[str, float]:
    import ray

    try:
        return ray.available_resources()
    except Exception:
        return {}


class ProgressView:
    """Lines redrawn in place on a TTY; elsewhere, printed again only when they change."""

    def __init__(self, out: Any) -> None:
        self.out, self.drawn, self.last = out, 0, None
        self.tty = bool(getattr(out, "isatty", lambda: False)())

    def show(self, elapsed_s: float, lines: list[str]) -> None:
        head = f"deploying for {elapsed_s:.0f} s" + (", pending:" if lines else "")
        if self.tty:
            self._clear()
            text = "\n".join([head, *lines])
            self.out.write(text + "\n")
            self.drawn = len(lines) + 1
        elif lines != self.last:
            self.out.write("\n".join([head, *lines]) + "\n")
        self.last = lines
        self.out.flush()

    def done(self, message: str) -> None:
        if self.tty:
            self._clear()
        if message:
            self.out.write(message + "\n")
        self.out.flush()

    def _clear(self) -> None:
        if self.drawn:
            self.out.write(f"\x1b[{self.drawn}F\x1b[J")
            self.drawn = 0


def stop(app_name: str, local: bool, timeout_s: float, stopper: Stopper,
         deployed: bool = True) -> int:
    """Delete the app (its requests in flight finish first), then, for a local run, Ray
    with Serve in it. Names what it waits for past NOTE_EVERY_S; a local run gives up at
    `timeout_s` and kills what is left. Returns the exit status. Not `serve.shutdown()`
    first: once the app is gone nothing of Serve's has work left, and its controller's
    ending its own call printed Ray's "Task ServeController.graceful_shutdown failed"
    lines on every stop; what Ray's ending leaves, `_end_leftovers` ends."""
    import ray
    from ray import serve

    if not deployed:  # Ray only: nothing of the app to delete
        if local:
            ray.shutdown()
            _end_leftovers(stopper)
        return 0
    print("stopping: deleting the app; requests in flight finish first"
          + (f" (up to {timeout_s:g} s)" if local else ""), flush=True)
    started = time.monotonic()
    serve.delete(app_name, _blocking=False)
    note_at = started + NOTE_EVERY_S
    while (state := serve.status().applications.get(app_name)) is not None:
        now = time.monotonic()
        if local and now - started > timeout_s:
            print(f"gave up after {timeout_s:g} s (ingress.stop_timeout_s): ending this "
                  "run's processes; requests still in flight fail", flush=True)
            stopper.now()
        if now >= note_at:
            waiting = "; ".join(line.strip() for line in stopping_lines(app_name, state))
            print(f"still stopping after {now - started:.0f} s, waiting for: {waiting} "
                  "(Ctrl-C again to stop at once)", flush=True)
            note_at = now + NOTE_EVERY_S
        time.sleep(0.1)
    if local:
        ray.shutdown()
        _end_leftovers(stopper)
    return 0


def _end_leftovers(stopper: Stopper) -> None:
    """End whatever Ray left of this run (its agents, HAProxy) and forget the run."""
    if stopper.run is not None:
        runs.end_run(stopper.run.run_id, grace_s=1.0)
        stopper.run.forget()
