"""The record of `benchmarks.cluster.faults`: the machine it ran on, and its README.

Kept apart from the runs so the benchmark reads as what it does; the README shows, per
scenario, the targets with their verdicts and the per-second timeline (answers by host,
failures by status) that the verdicts come from.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def machine() -> dict[str, Any]:
    import ray

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), platform.processor())
    git = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO,
                         capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "cpus": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "ray": ray.__version__, "git": git,
            "load_start": os.getloadavg()}


def fmt(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, float) else "none" if v is None else str(v)


def _scenario_md(r: dict[str, Any]) -> list[str]:
    f = {k: fmt(r[k]) for k in ("first_survivor_answer_s", "longest_survivor_gap_s",
                                 "replacement_first_answer_s")}
    heal = f"; healed at {r['heal_s']:.1f} s" if r["name"] == "partition" else ""
    return [
        f"## {r['name']}: {r['hosts']} hosts, victim {r['victim']}", "",
        f"Replicas before: {', '.join(r['replicas_before'])}; after: "
        f"{', '.join(r['replicas_after'])}. {r['requests']} requests, {r['answers']} answers, "
        f"failures by status {r['failures']} (0 = reset or no answer), slowest "
        f"{r['slowest_s']:.2f} s; answers/s before {r['before_per_s']:.1f}, the surviving "
        f"host's in 0-2 s {r['survivor_0_2s_per_s']:.1f}; its first answer to a request sent "
        f"after the fault at {f['first_survivor_answer_s']} s, longest gap between its answers "
        f"{f['longest_survivor_gap_s']} s; a replacement's first answer at "
        f"{f['replacement_first_answer_s']} s; the victim's answers to requests sent after "
        f"the fault: {r['victim_answers_after_fault']}{heal}.", "",
        "| target | measured | verdict |", "|---|---|---|",
        *(f"| {t['target']} | {fmt(t['measured'])} | **{t['verdict']}** |"
          for t in r["targets"]), "",
        "| s | answers | by host | failures by status |", "|---|---|---|---|",
        *(f"| {x['s']} | {x['answers']} | "
          f"{', '.join(f'{h}: {n}' for h, n in sorted(x['by_host'].items()))} | "
          f"{', '.join(f'{k}: {n}' for k, n in sorted(x['failed'].items())) or '-'} |"
          for x in r["timeline"]), "",
        *([f"Bad failures (first 5): {r['bad_failures'][:5]}", ""] if r["bad_failures"] else [])]


def readme(out: dict[str, Any]) -> str:
    m, s = out["machine"], out["settings"]
    return "\n".join([
        "# Host faults under load on a lab of hosts: the fault targets", "",
        f"Date: {out['date']}. Machine: {m['cpus']} CPUs ({m['cpu']}), kernel {m['kernel']}, "
        f"Python {m['python']}, Ray {m['ray']}, tree {m['git']}; load average {m['load_start']}"
        f" at the start, {m['load_end']} at the end (a shared machine).", "",
        f"Command: `{out['command']}`", "",
        f"Lab: worker hosts at {s['cpus']} CPU each (network namespaces, 198.18.0.10+), Ray's "
        "head, the ingress and the batching actor on the head (198.18.0.1); model "
        "`NodeSquare` (each answer carries its replica's host and pid), 2 replicas "
        f"(`labhost: 0.5`, spread one per host). Load: {s['clients']} closed-loop clients "
        "(http.client threads on the head, keep-alive, one OIP JSON item each, deadline "
        f"{s['deadline']} s as `parameters.timeout`), every answer checked against its own "
        f"input; {s['before']} s of load before the fault (t = 0 in the timelines, by when "
        "each request ended). Late: ended past its deadline + 1 s.", "",
        *(line for r in out["scenarios"] for line in _scenario_md(r))])
