"""Host faults under load on a lab of hosts: a host killed, partitioned, or losing power.

    flock /tmp/raybatch-ray.lock .venv/bin/python -m benchmarks.cluster.faults

(root; about 5 minutes.) Ray's head, the ingress and the batching actor on the lab's head
(`labhead`), two replicas on the worker hosts (`labhost: 0.5`, spread one per host).
`NodeSquare` answers [x, 0] with [x², its replica's host and pid]: each answer is checked
against its own input and attributed. `--clients` closed-loop threads on the head, one OIP
JSON item each with `parameters.timeout` = `--deadline`, through `kill` (host 0's processes
killed), `partition` (host 1 cut off for 10 s, healed), `power` (3 hosts: a replica's host
loses its link, then its processes), each until a new replica answers (or a limit).
Per scenario a timeline and PASS/MISS per fault target, to `--results`.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from batching.model import VectorTransformer
from benchmarks.cluster.faults_report import fmt, machine, readme

REPO = Path(__file__).resolve().parents[2]
APP, MODEL = "faults", "nodesquare"
GRACE_S = 1.0  # a request may end this long after its deadline and still count as on time
RB = str(Path(sys.executable).parent / "raybatch")


class NodeSquare(VectorTransformer):
    """FP32 [-1, 2] → FP32 [-1, 2]: each item [x, _] → [x², tag], where tag = the replica
    host's last address byte × 1e5 + its pid mod 1e5 (exact in FP32)."""

    def setup(self, device: str) -> None:
        import ray

        octet = int(ray.util.get_node_ip_address().rsplit(".", 1)[1])
        self.tag = float(octet * 100_000 + os.getpid() % 100_000)

    def preprocess(self, items: Sequence[Any]) -> np.ndarray:
        return np.asarray(items, dtype=np.float32).reshape(-1, 2)

    def transform(self, xs: np.ndarray) -> np.ndarray:
        out = np.empty_like(xs)
        out[:, 0] = xs[:, 0] * xs[:, 0]
        out[:, 1] = self.tag
        return out


def host_of(tag: int) -> str:  # the address of the host whose replica answered
    return f"198.18.0.{tag // 100_000}"


def app_config(replicas: int) -> dict[str, Any]:
    tensor = {"datatype": "FP32", "shape": [-1, 2]}
    head = {"labhead": 0.001}  # only the head advertises it
    return {
        "app_name": APP, "python_path": [str(REPO)],
        "ingress": {"num_cpus": 0, "resources": head, "route_prefix": "/"},
        "models": [{
            "name": MODEL, "transformer": "benchmarks.cluster.faults:NodeSquare",
            "inputs": [{"name": "INPUT0", **tensor}], "outputs": [{"name": "OUTPUT0", **tensor}],
            "batching": {"max_batch_size": 32, "max_queue_delay_s": 0.002,
                         "idle_dispatch": True},
            # two fit a host (labhost: 1): where they go is the spread's choice
            "replicas": {"min_replicas": replicas, "max_replicas": replicas, "num_cpus": 0.1,
                         "pin": "off", "in_process": False, "resources": {"labhost": 0.5}},
            "batcher": {"placement": "actor", "num_cpus": 0, "resources": head},
        }],
    }


# -- the cluster -------------------------------------------------------------------------------
@dataclass
class Serving:
    """The app deployed on a lab: where it answers, and what runs where."""

    lab: Any
    head: str
    env: dict[str, str]
    native_port: int
    logs: Path | None = None

    def status(self, model: str = MODEL) -> dict[str, Any]:
        """`model`'s `raybatch status --json` (each part's `node_ip`); {} if unreadable."""
        st = self.lab.run(None, [RB, "status", "--address", self.head, "--app", APP, "--json"],
                          env=self.lab.ray_env(self.env), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
        try:
            return json.loads(st.communicate(timeout=60)[0])[model]
        except (ValueError, KeyError, subprocess.TimeoutExpired):
            st.kill()
            return {}

    def replicas(self, model: str = MODEL) -> list[str]:  # each ALIVE replica's node address
        return sorted(r.get("node_ip") or "?" for r in self.status(model).get("replica_info", [])
                      if r.get("state") == "ALIVE")

    def join(self, host: int) -> None:
        """`raybatch join` on `host` (as serving() joins its hosts); does not wait for it."""
        log = None if self.logs is None else self.logs / f"host{host}.log"
        self.lab.join(host, self.head, num_cpus=1, resources={"labhost": 1}, log=log)


@contextmanager
def serving(hosts: int, cpus: float, replicas: int, logs: Path,
            config: dict[str, Any] | None = None, joined: int | None = None
            ) -> Iterator[Serving]:
    """A lab, Ray on it, the app up (`raybatch up --address`), `MODEL`'s replicas ALIVE.
    `config`: the app's (default `app_config(replicas)`); `joined`: the hosts joined before
    it is deployed (default all of them; `Serving.join` joins the others later)."""
    import yaml

    from benchmarks.cluster.lab import Lab
    from cluster.ports import free_port

    logs.mkdir(parents=True, exist_ok=True)
    with Lab(hosts=hosts, cpus=cpus) as lab:
        p = {k: free_port("0.0.0.0") for k in ("http", "native", "grpc", "stats", "metrics")}
        env = {"RAY_SERVE_HAPROXY_STATS_PORT": str(p["stats"]),
               "RAY_SERVE_HAPROXY_METRICS_PORT": str(p["metrics"])}
        head = lab.start_head(num_cpus=1, ray_args=["--resources", '{"labhead": 1}'], env=env,
                              log=logs / "head.log")
        s = Serving(lab, head, env, p["native"], logs)
        joined = hosts if joined is None else joined
        for h in range(joined):
            s.join(h)
        lab.wait_nodes(head, joined + 1, timeout_s=120)
        cfg = logs / "config.yaml"
        cfg.write_text(yaml.safe_dump(config or app_config(replicas), sort_keys=False))
        up = lab.run(None, [RB, "up", "--address", head, "--config", str(cfg), "--host",
                            "0.0.0.0", "--port", str(p["http"]), "--native-port",
                            str(p["native"]), "--grpc-port", str(p["grpc"]),
                            "--exit-after-deploy"],
                     env=lab.ray_env(env), log=logs / "up.log", cwd=REPO)
        if up.wait(timeout=300) != 0:
            raise RuntimeError(f"raybatch up failed: see {logs / 'up.log'}")
        give_up = time.monotonic() + 120
        while len(s.replicas()) < replicas:
            if time.monotonic() > give_up:
                raise RuntimeError(f"replicas not all ALIVE after 120 s: {s.status()}")
            time.sleep(1)
        yield s


# -- the load ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Outcome:
    """One request: started at `t0`, ended at `t1` (monotonic s); `verdict` is `ok` (its own
    x², `tag` its replica), `refused` (503/504 with a JSON {"error": ...} body), `wrong`
    (another value), or `bad` (any other status, a reset, no JSON body, no answer)."""

    client: int
    x: float
    t0: float
    t1: float
    status: int
    verdict: str
    tag: int | None = None
    error: str = ""


class Load:
    """`clients` closed-loop clients, each with its own inputs (x = client·1e5 + n, exact
    in FP32), every request with the deadline `deadline_s` (OIP `parameters.timeout`, µs)."""

    def __init__(self, port: int, clients: int, deadline_s: float, host: str = "198.18.0.1"):
        self.address, self.clients, self.deadline_s = (host, port), clients, deadline_s
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(c,), daemon=True)
                         for c in range(clients)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> list[Outcome]:
        """Stop; each client's last request ends (its socket's timeout: deadline + 10 s)."""
        self._stop.set()
        for t in self._threads:
            t.join(self.deadline_s + 15)
        return sorted(self.outcomes, key=lambda o: o.t1)

    def _client(self, c: int) -> None:
        path = f"/v2/models/{MODEL}/infer"
        conn, n = None, 0
        while not self._stop.is_set():
            if conn is None:
                conn = http.client.HTTPConnection(*self.address, timeout=self.deadline_s + 10)
            x = float(c * 100_000 + n % 100_000)
            n += 1
            body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2],
                                           "data": [x, 0.0]}],
                               "parameters": {"timeout": int(self.deadline_s * 1e6)}})
            t0 = time.monotonic()
            try:
                conn.request("POST", path, body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                done, keep = judge(c, x, t0, r.status, r.read()), not r.will_close
            except (OSError, http.client.HTTPException) as e:  # a reset, or no answer
                done, keep = Outcome(c, x, t0, time.monotonic(), 0, "bad", None,
                                     f"{type(e).__name__}: {e}"[:200]), False
            self.outcomes.append(done)
            if not keep:
                conn.close()
                conn = None


def judge(c: int, x: float, t0: float, status: int, data: bytes) -> Outcome:
    t1 = time.monotonic()
    try:
        doc = json.loads(data)
    except ValueError:
        return Outcome(c, x, t0, t1, status, "bad", None, f"not JSON: {data[:120]!r}")
    if status != 200:
        ok = status in (503, 504) and isinstance(doc, dict) and "error" in doc
        return Outcome(c, x, t0, t1, status, "refused" if ok else "bad", None,
                       str(doc)[:200])
    try:
        got, tag = doc["outputs"][0]["data"]
    except (KeyError, IndexError, TypeError, ValueError):
        return Outcome(c, x, t0, t1, status, "wrong", None, str(doc)[:200])
    want = float(np.float32(x) * np.float32(x))
    if float(np.float32(got)) != want:
        return Outcome(c, x, t0, t1, status, "wrong", int(tag), f"{got} for x={x}")
    return Outcome(c, x, t0, t1, status, "ok", int(tag))


def late(outcomes: Sequence[Outcome], deadline_s: float) -> list[Outcome]:
    """Requests that ended past their deadline + GRACE_S (or never)."""
    return [o for o in outcomes if o.t1 - o.t0 > deadline_s + GRACE_S]


def timeline(outcomes: Sequence[Outcome], t_zero: float) -> list[dict[str, Any]]:
    """Per second from `t_zero` (by end): answers, by host, failures by status (0: reset)."""
    rows: dict[int, dict[str, Any]] = {}
    for o in outcomes:
        row = rows.setdefault(int(np.floor(o.t1 - t_zero)),
                              {"answers": 0, "by_host": Counter(), "failed": Counter()})
        if o.verdict == "ok":
            row["answers"] += 1
            row["by_host"][host_of(o.tag)] += 1
        else:
            row["failed"][str(o.status)] += 1
    return [{"s": s, "answers": r["answers"], "by_host": dict(r["by_host"]),
             "failed": dict(r["failed"])} for s, r in sorted(rows.items())]


# -- the scenarios -----------------------------------------------------------------------------
def partition(app: Serving, victim: int, hold_s: float = 10.0) -> None:
    app.lab.partition(victim)
    try:
        time.sleep(hold_s)
    finally:
        app.lab.heal(victim)


SCENARIOS = {  # hosts, the fault (a power loss leaves the link down), the most to wait
    "kill": (2, lambda app, victim: app.lab.kill(victim), 40.0),
    "partition": (2, partition, 40.0),
    "power": (3, lambda app, victim: app.lab.power_loss(victim), 100.0)}


def run_scenario(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One lab, the load on, the fault at t=0; the load runs until a replica not seen before
    the fault answers (its replacement) or the scenario's limit, then `--tail` s more."""
    hosts, fault, limit_s = SCENARIOS[name]
    with serving(hosts, args.cpus, 2, args.logs / name) as app:
        placed = app.replicas()
        victim = 1 if name == "partition" else int(placed[0].rsplit(".", 1)[1]) - 10
        victim_ip = app.lab.address(victim)
        with Load(app.native_port, args.clients, args.deadline) as load:
            give_up = time.monotonic() + 90
            while len({o.tag for o in load.outcomes if o.verdict == "ok"}) < 2:
                if time.monotonic() > give_up:
                    raise RuntimeError(f"{name}: no answers from two replicas in 90 s")
                time.sleep(0.2)
            time.sleep(args.before)
            t_fault = time.monotonic()
            seen = {o.tag for o in load.outcomes if o.verdict == "ok"}
            fault(app, victim)
            t_back = time.monotonic()  # the partition's heal; else = the fault
            while not any(o.verdict == "ok" and o.tag not in seen for o in load.outcomes):
                if time.monotonic() > t_fault + limit_s:
                    break
                time.sleep(0.2)
            time.sleep(args.tail)
        outcomes = load.stop()
        after = app.status().get("replica_info", [])
    return {"name": name, "hosts": hosts, "victim": victim_ip, "replicas_before": placed,
            "replicas_after": sorted(f"{r.get('node_ip')} {r.get('state')}" for r in after),
            **analyse(name, outcomes, t_fault, t_back, seen, victim_ip, args)}


def analyse(name: str, outcomes: list[Outcome], t_fault: float, t_back: float, seen: set,
            victim_ip: str, args: argparse.Namespace) -> dict[str, Any]:
    ok = [o for o in outcomes if o.verdict == "ok"]
    survivor = [o for o in ok if host_of(o.tag) != victim_ip]

    def rate(got: list[Outcome], a: float, b: float) -> float:
        return sum(t_fault + a < o.t1 <= t_fault + b for o in got) / (b - a)

    new = [o.t1 - t_fault for o in ok if o.tag not in seen]
    failed = [o for o in outcomes if o.verdict != "ok" and o.t1 > t_fault]
    old_victim = {t for t in seen if host_of(t) == victim_ip}
    stale = [o for o in ok if o.tag in old_victim and failed and o.t1 > failed[0].t1]
    gaps = [b.t1 - a.t1 for a, b in itertools.pairwise(survivor) if b.t1 > t_fault]
    m = {"requests": len(outcomes), "answers": len(ok),
         "wrong": sum(o.verdict == "wrong" for o in outcomes),
         "failures": dict(Counter(str(o.status) for o in outcomes if o.verdict != "ok")),
         "bad_failures": [asdict(o) for o in outcomes if o.verdict == "bad"],
         "past_deadline_plus_1s": len(late(outcomes, args.deadline)),
         "slowest_s": max(o.t1 - o.t0 for o in outcomes),
         "before_per_s": rate(ok, -args.before, 0.0),
         "survivor_0_2s_per_s": rate(survivor, 0.0, 2.0),
         "first_survivor_answer_s": min((o.t1 - t_fault for o in survivor if o.t0 > t_fault),
                                        default=None),
         "longest_survivor_gap_s": max(gaps, default=None),
         "replacement_first_answer_s": min(new, default=None),
         "stale_answers_after_error": len(stale),
         "victim_answers_after_fault": sum(host_of(o.tag) == victim_ip and o.t0 > t_fault
                                           for o in ok),
         "heal_s": t_back - t_fault,
         "timeline": timeline(outcomes, t_fault)}
    m["targets"] = targets(name, m)
    return m


def targets(name: str, m: dict[str, Any]) -> list[dict[str, Any]]:
    """PASS/MISS per fault target for this scenario."""
    rows = [("0 wrong or duplicated answers", m["wrong"], m["wrong"] == 0),
            ("0 requests past deadline + 1 s", m["past_deadline_plus_1s"],
             m["past_deadline_plus_1s"] == 0)]
    if name == "kill":
        ratio = m["survivor_0_2s_per_s"] / m["before_per_s"] if m["before_per_s"] else 0.0
        full = m["replacement_first_answer_s"]
        bad = len(m["bad_failures"])
        rows += [("every failure a 503/504 with a JSON body", bad, bad == 0),
                 ("surviving host within 2 s >= 0.4x before", round(ratio, 2), ratio >= 0.4),
                 ("full service (a replacement answers) <= 30 s", full,
                  full is not None and full <= 30)]
    elif name == "partition":
        rows += [("no answer from the cut-off replica after a client's error for it",
                  m["stale_answers_after_error"], m["stale_answers_after_error"] == 0)]
    else:
        first, full = m["first_survivor_answer_s"], m["replacement_first_answer_s"]
        rows += [("surviving host serves within 5 s", first, first is not None and first <= 5),
                 ("lost replica replaced (its replacement answers) <= 90 s", full,
                  full is not None and full <= 90)]
    return [{"target": t, "measured": v, "verdict": "PASS" if ok else "MISS"}
            for t, v, ok in rows]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    for flag, default, what in (("--cpus", 0.5, "each worker host's CPU quota"),
                                ("--clients", 64, "closed-loop clients"),
                                ("--deadline", 3.0, "each request's timeout, s"),
                                ("--before", 5.0, "s of load before the fault"),
                                ("--tail", 3.0, "s of load after the replacement answers")):
        p.add_argument(flag, type=type(default), default=default, help=what)
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    p.add_argument("--results", type=Path,
                   default=REPO / "benchmarks" / "results" / f"{day}-lab-host-faults")
    p.add_argument("--logs", type=Path, default=Path("/tmp/raybatch-faults-logs"))
    args = p.parse_args(argv)
    out: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
        "command": "flock /tmp/raybatch-ray.lock .venv/bin/python -m "
                   + " ".join(["benchmarks.cluster.faults", *(argv or sys.argv[1:])]),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "config": app_config(2), "scenarios": []}
    for name in args.scenarios:
        t0 = time.monotonic()
        r = run_scenario(name, args)
        out["scenarios"].append(r)
        print(f"{name} ({time.monotonic() - t0:.0f} s): " + "; ".join(
            f"{t['target']}: {fmt(t['measured'])} {t['verdict']}" for t in r["targets"]),
            flush=True)
    out["machine"]["load_end"] = os.getloadavg()
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "result.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
    (args.results / "README.md").write_text(readme(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
