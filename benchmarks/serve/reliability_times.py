"""How soon: the times and rates the integration tests no longer assert, against targets.

    python -m benchmarks.serve.reliability_times overload [--seconds 6]
    python -m benchmarks.serve.reliability_times recovery
    python -m benchmarks.serve.reliability_times burst [--requests 1500]
    python -m benchmarks.serve.reliability_times stop
        [--out FILE.json]

A test never passes or fails on the machine's speed (DESIGN.md: tests assert behaviour,
benchmarks assert speed). The tests below check what happened; this module runs the
same scenarios, built from the tests' own helpers, and measures how fast it happened:

- `overload` (tests/integration/test_load.py): the app `overload`, model `slow` (500 ms a
  batch of at most 4: 8 requests/s), 10x that open loop for `--seconds` on the fast
  path, `ingress.default_timeout_s: 2`, then ten calm requests one at a time. Targets:
  the accepted requests' p99 within the timeout plus 0.25 s (the HTTP hops and the Ray
  calls the engine cannot see); no 504 (deadline admission refuses at the door what
  would pass its deadline in the queue); the model kept busy (at least half its
  capacity answered 200); every calm request answered within 1 s (one batch is 0.5 s).
- `recovery` (tests/integration/test_faults.py): the app `faults`; SIGKILL of the `slow`
  model's batching actor, then of one of two ingress replicas, under closed-loop HTTP
  load; and a batch that hangs past `replicas.batch_timeout_s` (2 s). Targets: from each
  kill to the last failed request within 30 s; the hung batch answered 504 within its
  timeout plus 10 s.
- `burst` (tests/e2e/test_burst_admission.py): the test app's `square` alone
  (tests/configs/app.yaml; `limits.max_queue_wait_s: 1`), `--requests` single-item
  requests at once on Raybatch's own HTTP port, raw sockets. Target: every one 200 (the
  replicas serve such a burst well inside the 1 s bound: admission by time accepts it
  whole).
- `stop` (tests/integration/test_up_stop.py): a local `raybatch up` of
  tests/configs/small.yaml (`ingress.stop_timeout_s` 10 s) stopped by Ctrl-C when idle,
  by a second Ctrl-C while it deploys, by `raybatch down`, and by Ctrl-C with a request
  held at a closed gate past a 4 s stop_timeout_s. Targets: idle Ctrl-C to exit within
  stop_timeout_s + 5 s; second Ctrl-C to exit within 5 s; `raybatch down` to the up's
  exit within stop_timeout_s + 5 s; the held request given up on, and the up gone,
  within 4 + 10 s.

Each prints its figures and targets as JSON (and writes them to `--out`); the exit
status is 1 if a target was missed. It starts Ray (`overload`, `recovery`, `burst`:
one local Ray; `stop`: a `raybatch up` at a time), so hold the machine's Ray lock:

    flock /tmp/raybatch-ray.lock timeout 900 .venv/bin/python \\
        -m benchmarks.serve.reliability_times overload
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _target(value: float, op: str, bound: float) -> dict[str, Any]:
    met = value <= bound if op == "<=" else value >= bound
    return {"measured": round(value, 4), "target": f"{op} {bound:g}", "met": bool(met)}


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[int(q * (len(xs) - 1))] if xs else float("nan")


@contextlib.contextmanager
def local_ray() -> Iterator[int]:
    """A local Ray and Serve as the test session starts them (the fast path on, no
    draining period); yields the port of Serve's HTTP proxy."""
    import ray
    from ray import serve

    from cluster.ports import free_port
    from deployments.http import FAST_PATH_ENV

    os.environ.update(FAST_PATH_ENV)
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "0")
    os.chdir(ROOT)  # workers import tests.* from the driver's directory
    ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()


# -- overload ------------------------------------------------------------------------------
def overload(args: argparse.Namespace) -> dict[str, Any]:
    from tests.integration import test_load as t

    with local_ray():
        _, direct = t.deploy(t.overload_app_config())
        url = f"{direct}{t.OVERLOAD_PREFIX}/v2/models/slow/infer"
        records, memory = t.overload(url, t.overload_pids(), args.seconds)
        calm = t.calm(url)
    counts = t.check_overload_answers(records)  # the test's checks hold here too
    accepted = [r[1] for r in records if r[2] == 200]
    calm_ok = [(st, b) for st, b, *_ in calm] == [
        (200, t.answer_of("slow", [float(x * x)])) for x in range(len(calm))]
    return {
        "scenario": f"slow at 10x capacity ({10 * t.CAPACITY_RPS:g}/s) for {args.seconds:g} s, "
                    f"timeout {t.TIMEOUT_S:g} s, fast path; then {len(calm)} calm requests",
        "statuses": {str(k): v for k, v in sorted(counts.items())},
        "accepted_latency_s": {"p50": round(_quantile(accepted, 0.5), 4),
                               "p99": round(_quantile(accepted, 0.99), 4),
                               "max": round(max(accepted, default=float("nan")), 4)},
        "rss_mib": {k: [round(v / 2**20, 1) for v in vs] for k, vs in memory.items()},
        "back_to_normal_s": round(calm[0][3] - max(r[0] for r in records), 3),
        "calm_answers_right": calm_ok,
        "targets": {
            "accepted_p99_s": _target(_quantile(accepted, 0.99), "<=", t.TIMEOUT_S + 0.25),
            "responses_504": _target(counts.get(504, 0), "<=", 0),
            "accepted_200": _target(len(accepted), ">=",
                                    0.5 * t.CAPACITY_RPS * args.seconds),
            "calm_max_latency_s": _target(max(c[2] for c in calm), "<=", 1.0),
        },
    }


# -- recovery ------------------------------------------------------------------------------
def recovery(args: argparse.Namespace) -> dict[str, Any]:
    from ray import serve

    from deployments.app import build_app
    from tests.conftest import alive_pids, arun, wait_until
    from tests.integration import test_faults as t

    out: dict[str, Any] = {"targets": {}}
    with local_ray() as port:
        serve.run(build_app(t.faults_config()), name=t.NAME, route_prefix=t.PREFIX)
        base = f"http://127.0.0.1:{port}{t.PREFIX}/v2/models"
        kills = (("batching_actor", lambda: alive_pids(*t.BATCHER), {503}),
                 ("ingress_replica", lambda: alive_pids(*t.INGRESS)[:1], {408, 500, 502, 503}))
        for what, pids, allowed in kills:
            load = t.Load(f"{base}/slow/infer")
            killed, recovered = arun(t.kill_under_load(load, pids()), timeout_s=t.HANG_S + 60)
            out[what] = {"statuses": {str(k): v for k, v in
                                      sorted(t.check_answers(load, allowed).items())}}
            out["targets"][f"{what}_kill_to_last_failure_s"] = _target(
                recovered - killed, "<=", 30.0)

            def whole() -> bool:
                deps = serve.status().applications[t.NAME].deployments
                return (deps["Ingress"].replica_states.get("RUNNING", 0) == 2
                        and len(alive_pids(*t.INGRESS)) == 2 and len(alive_pids(*t.BATCHER)) == 1)
            wait_until(whole, timeout_s=t.HANG_S, what="the app to be whole again")

        async def hung() -> tuple[int, str, float]:
            import aiohttp

            async with aiohttp.ClientSession() as s:
                t0 = time.monotonic()
                status, doc, _ = await t.post(s, f"{base}/hang/infer", -1.0)
                return status, str(doc), time.monotonic() - t0
        status, doc, waited = arun(hung(), timeout_s=t.HANG_S)
        out["hung_batch"] = {"status": status, "error": doc[:200]}
        out["targets"]["hung_batch_answered_s"] = _target(
            waited if status == 504 else float("inf"), "<=", t.HANG_TIMEOUT_S + 10)
    return out


# -- burst ---------------------------------------------------------------------------------
def burst(args: argparse.Namespace) -> dict[str, Any]:
    import yaml
    from ray import serve

    from cluster.config import load_config
    from cluster.ports import free_port
    from deployments.app import build_app
    from tests.conftest import APP_CONFIG
    from tests.e2e import test_burst_admission as t

    data = yaml.safe_load(APP_CONFIG.read_text())
    data["models"] = [m for m in data["models"] if m["name"] == "square"]
    data["ingress"]["native_port"] = free_port()
    config = load_config(data)
    with local_ray():
        serve.run(build_app(config), name=config.app_name,
                  route_prefix=config.ingress.route_prefix)
        t0 = time.monotonic()
        answers = t.burst(config.ingress.native_port, t.bodies(args.requests))
        took = time.monotonic() - t0
    counts = t.check_burst(answers)
    return {"scenario": f"{args.requests} single-item requests at once to square "
                        "(tests/configs/app.yaml, alone), Raybatch's own HTTP port",
            "statuses": dict(counts), "all_answered_s": round(took, 3),
            "targets": {"answered_200": _target(counts[200], ">=", args.requests)}}


# -- stop ----------------------------------------------------------------------------------
@contextlib.contextmanager
def up_world() -> Iterator[tuple[dict[str, str], dict[str, int], list[Any], Path]]:
    """What tests/integration/test_up_stop.py's `world` fixture makes: an environment
    with a state folder of its own, ports, and the ups started (ended at the end)."""
    from cluster.ports import free_port
    from raybatch import runs

    with tempfile.TemporaryDirectory(prefix="reliability-stop-") as tmp:
        ports = {"http": free_port(), "grpc": free_port()}
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update({runs.STATE_DIR_ENV: str(Path(tmp, "state")), "PYTHONPATH": str(ROOT),
                    "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
                    "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port())})
        os.environ[runs.STATE_DIR_ENV] = env[runs.STATE_DIR_ENV]
        started: list[Any] = []
        try:
            yield env, ports, started, Path(tmp)
        finally:
            for up in started:
                if up.proc.poll() is None:
                    up.kill()
            for run in runs.runs():  # this state folder's only
                runs.end_run(run.run_id, grace_s=1)


def stop(args: argparse.Namespace) -> dict[str, Any]:
    from cluster.config import load_config
    from tests.integration import test_up_stop as t

    bound = load_config(t.CONFIG).ingress.stop_timeout_s
    out: dict[str, Any] = {"stop_timeout_s": bound, "targets": {}}

    def timed(name: str, up: Any, target_s: float, code: int) -> None:
        t0 = time.monotonic()
        got = up.exit_code()
        took = time.monotonic() - t0
        out[name] = {"exit_code": got, "s": round(took, 2)}
        out["targets"][f"{name}_s"] = _target(took if got == code else float("inf"), "<=",
                                              target_s)

    with up_world() as (env, ports, started, _):
        up = t.Up(env, ports)
        started.append(up)
        up.wait_for(t.READY)
        up.answers()
        time.sleep(1)
        up.ctrl_c()
        timed("idle_ctrl_c", up, bound + 5, 0)
    with up_world() as (env, ports, started, _):
        up = t.Up(env, ports)
        started.append(up)
        up.wait_for("deploying")
        up.ctrl_c()
        up.wait_for("Ctrl-C again to stop at once")
        up.ctrl_c()
        timed("second_ctrl_c", up, 5.0, 130)
    with up_world() as (env, ports, started, _):
        up = t.Up(env, ports)
        started.append(up)
        up.wait_for(t.READY)
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "raybatch", "down"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=t.HANG_S)
        got = up.exit_code()
        took = time.monotonic() - t0
        out["raybatch_down"] = {"exit_code": got, "s": round(took, 2)}
        out["targets"]["raybatch_down_s"] = _target(took if got == 0 else float("inf"), "<=",
                                                    bound + 5)
    with up_world() as (env, ports, started, tmp):
        gate = tmp / "gate"
        gate.touch()
        up = t.Up(env, ports, t.gated_config(tmp, gate, stop_timeout_s=4))
        started.append(up)
        up.wait_for(t.READY)
        t.in_flight(up)
        up.ctrl_c()
        timed("given_up_after_4s", up, 4 + 10, 130)
    return out


SCENARIOS = {"overload": overload, "recovery": recovery, "burst": burst, "stop": stop}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--seconds", type=float, default=6.0, help="overload: how long")
    p.add_argument("--requests", type=int, default=1500, help="burst: how many")
    p.add_argument("--out", type=Path, default=None, help="write the result here (JSON)")
    args = p.parse_args(argv)
    result = {"scenario_name": args.scenario, **SCENARIOS[args.scenario](args)}
    missed = [k for k, v in result["targets"].items() if not v["met"]]
    result["missed"] = missed
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
