"""The comparison's targets and its table.

A result is `{"models": {name: {"ceiling_items_per_s", "points": [...]}}}`, each
point `{"concurrency", "loadavg_1m", "handle": {system: LoadResult dict},
"http": {system: ...}}`. Ratios are taken against `serve.batch` on the same
path at the same concurrency, measured seconds apart.
"""

from __future__ import annotations

from typing import Any

BASELINE = "serve.batch"
SLEEP_C, MLP_HTTP_C, MINILM_C, LATENCY_C = 128, 128, 64, 1


def _point(results: dict[str, Any], model: str, c: int) -> dict[str, Any] | None:
    m = results["models"].get(model)
    if m is None:
        return None
    return next((p for p in m["points"] if p["concurrency"] == c), None)


def _rps(point: dict[str, Any], path: str, system: str) -> float | None:
    r = point.get(path, {}).get(system)
    return None if r is None or not r["requests"] else r["throughput_rps"]


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _target(name: str, value: float | None, ok: bool | None, detail: str) -> dict[str, Any]:
    return {"name": name, "value": value, "passed": ok, "detail": detail}


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with its measured value (None: not measured in this run)."""
    out = []
    if (p := _point(results, "sleep", SLEEP_C)) is not None:
        ceiling = p["ceiling_items_per_s"]
        rps = _rps(p, "handle", "raybatch.client")
        frac = _ratio(rps, ceiling)
        out.append(_target(f"sleep client C={SLEEP_C} >= 0.95 of ceiling", frac,
                           None if frac is None else frac >= 0.95,
                           f"{rps or 0:,.0f} of {ceiling:,.0f} items/s"))
        x = _ratio(rps, _rps(p, "handle", BASELINE))
        out.append(_target(f"sleep client C={SLEEP_C} >= 8x @serve.batch (handle)", x,
                           None if x is None else x >= 8.0, ""))
    if (p := _point(results, "mlp", MLP_HTTP_C)) is not None:
        x = _ratio(_rps(p, "http", "raybatch"), _rps(p, "http", BASELINE))
        out.append(_target(f"mlp HTTP C={MLP_HTTP_C} >= 2x @serve.batch (HTTP)", x,
                           None if x is None else x >= 2.0, ""))
    if (p := _point(results, "minilm", MINILM_C)) is not None:
        offline = p["ceiling_items_per_s"]
        rps = _rps(p, "http", "raybatch")
        frac = _ratio(rps, offline)
        out.append(_target(f"minilm HTTP C={MINILM_C} >= 0.85 of offline encode", frac,
                           None if frac is None else frac >= 0.85,
                           f"{rps or 0:,.0f} of {offline:,.0f} sentences/s"))
        x = _ratio(rps, _rps(p, "http", BASELINE))
        out.append(_target(f"minilm HTTP C={MINILM_C} >= 1.2x @serve.batch (HTTP)", x,
                           None if x is None else x >= 1.2, ""))
    for model in results["models"]:
        if (p := _point(results, model, LATENCY_C)) is None or "handle" not in p:
            continue
        ours, theirs = p["handle"].get("raybatch"), p["handle"].get(BASELINE)
        if ours and theirs:
            x = _ratio(ours["p50_ms"], theirs["p50_ms"])
            out.append(_target(f"{model} handle C={LATENCY_C} p50 <= @serve.batch p50", x,
                               None if x is None else x <= 1.0,
                               f"{ours['p50_ms']:.2f} vs {theirs['p50_ms']:.2f} ms"))
    return out


def render(results: dict[str, Any]) -> str:
    head = (f"{'model':<7}{'path':<7}{'C':>4}  {'system':<19}{'req/s':>8}{'vs @batch':>10}"
            f"{'%ceil':>7}{'p50 ms':>8}{'p99 ms':>9}{'batch':>7}{'client':>8}{'server':>8}"
            f"{'load':>6}")
    lines = [head, "-" * len(head)]
    for model, m in results["models"].items():
        for path in ("handle", "http"):
            for p in m["points"]:
                for system, r in p.get(path, {}).items():
                    lines.append(_row(model, path, p, system, r))
        ceilings = ", ".join(f"C={p['concurrency']}: {p['ceiling_items_per_s']:,.0f}"
                             for p in m["points"])
        lines.append(f"{model}: ceiling items/s ({m['ceiling_kind']}), measured before each "
                     f"point: {ceilings}")
        for hop, v in m.get("hops", {}).items():
            lines.append(f"  hop  {hop:<52} p50 {v['p50_ms']:7.2f} ms   caller CPU "
                         f"{v['caller_cpu_us']:6.0f} us")
    lines.append("client/server: CPU us per request of the load generator's process / of all "
                 "Ray processes; load: 1-minute load average at the point")
    lines += _cpu_breakdown(results)
    lines.append("")
    for t in results["targets"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[t["passed"]]
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        lines.append(f"{verdict}  {t['name']}: {value}  {t['detail']}".rstrip())
    return "\n".join(lines)


TARGET_POINTS = (("sleep", "handle", SLEEP_C), ("mlp", "http", MLP_HTTP_C),
                 ("minilm", "http", MINILM_C))


def _cpu_breakdown(results: dict[str, Any]) -> list[str]:
    """Where the servers' CPU goes at the targets' points: us per request, by Ray process."""
    lines = []
    for model, path, c in TARGET_POINTS:
        p = _point(results, model, c)
        if p is None or path not in p:
            continue
        lines.append(f"server CPU by process, {model} {path} C={c} (us/request):")
        for system, r in p[path].items():
            top = list(r.get("server_cpu_us_per_req_by_process", {}).items())[:5]
            parts = [f"{name.removeprefix('ray::')} {us:.0f}" for name, us in top]
            lines.append(f"  {system:<19}" + ", ".join(parts))
    return lines


def _row(model: str, path: str, p: dict[str, Any], system: str, r: dict[str, Any]) -> str:
    ceiling = p["ceiling_items_per_s"]
    base = _rps(p, path, BASELINE)
    ratio = _ratio(r["throughput_rps"], base)
    err = f"  ERRORS {r['errors']}: {r['first_error']}" if r["errors"] else ""
    server = r.get("server_cpu_us_per_req")
    return (f"{model:<7}{path:<7}{p['concurrency']:>4}  {system:<19}{r['throughput_rps']:>8,.0f}"
            f"{'' if ratio is None else f'{ratio:.2f}x':>10}{r['throughput_rps'] / ceiling:>7.0%}"
            f"{r['p50_ms']:>8.2f}{r['p99_ms']:>9.2f}{r['mean_batch_size'] or 0:>7.1f}"
            f"{r['client_cpu_us_per_req']:>8.0f}{'-' if server is None else f'{server:.0f}':>8}"
            f"{p['loadavg_1m']:>6.2f}{err}")
