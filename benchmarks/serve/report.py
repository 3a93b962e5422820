"""The comparison's targets and its table.

A result is `{"models": {name: {"ceiling_items_per_s", "points": [...]}}}`, each
point `{"concurrency", "loadavg_1m", "handle": {system: LoadResult dict},
"http": {system: ...}}`. Ratios are taken against `serve.batch` on the same
path at the same concurrency, measured seconds apart.
"""

from __future__ import annotations

from typing import Any

BASELINE = "serve.batch"
STDJSON = "serve.batch.stdjson"  # context only: @serve.batch with Serve's documented JSON
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


def _variants(results: dict[str, Any]) -> list[str]:
    """The Raybatch systems of the run (`rb:actor`, `rb:ingress+idle`, ...)."""
    seen: list[str] = []
    for m in results["models"].values():
        for p in m["points"]:
            for path in ("handle", "http"):
                for system in p.get(path, {}):
                    if system.startswith("rb:") and "/" not in system and system not in seen:
                        seen.append(system)
    return seen


def _at_least(name: str, value: float | None, bound: float, detail: str = "") -> dict[str, Any]:
    return _target(name, value, None if value is None else value >= bound, detail)


def _variant_targets(results: dict[str, Any], rb: str) -> list[dict[str, Any]]:
    """The product-path targets (docs/performance.md) for one Raybatch variant `rb`."""
    out = []
    binary = results.get("settings", {}).get("binary_http", True)
    if (p := _point(results, "sleep", SLEEP_C)) is not None:
        ceiling = p["ceiling_items_per_s"]
        rps = _rps(p, "handle", f"{rb}/client")
        out.append(_at_least(f"{rb} sleep client C={SLEEP_C} >= 0.95 of ceiling",
                             _ratio(rps, ceiling), 0.95, f"{rps or 0:,.0f} of {ceiling:,.0f}"))
        rps = _rps(p, "http", rb)
        out.append(_at_least(f"{rb} sleep HTTP C={SLEEP_C} >= 0.9 of ceiling",
                             _ratio(rps, ceiling), 0.9, f"{rps or 0:,.0f} of {ceiling:,.0f}"))
    for model in ("sleep", "mlp"):
        if (p := _point(results, model, SLEEP_C)) is not None:
            x = _ratio(_rps(p, "handle", rb), _rps(p, "handle", BASELINE))
            out.append(_at_least(f"{rb} {model} handle C={SLEEP_C} >= 1x @serve.batch", x, 1.0))
    if (p := _point(results, "mlp", MLP_HTTP_C)) is not None:
        bound = 2.5 if binary else 3.0
        x = _ratio(_rps(p, "http", rb), _rps(p, "http", BASELINE))
        out.append(_at_least(f"{rb} mlp HTTP C={MLP_HTTP_C} >= {bound}x @serve.batch "
                             f"({'binary' if binary else 'JSON'})", x, bound))
        if not binary and STDJSON in p.get("http", {}):
            x = _ratio(_rps(p, "http", rb), _rps(p, "http", STDJSON))
            out.append(_target(f"{rb} mlp HTTP C={MLP_HTTP_C} JSON vs @serve.batch with "
                               "stdlib JSON (request.json/JSONResponse)", x, None,
                               "context, not a target"))
        r = p.get("http", {}).get(rb)
        if r and r.get("own_and_front_cpu_us_per_req") is not None:
            us = r["own_and_front_cpu_us_per_req"]
            out.append(_target(f"{rb} mlp HTTP C={MLP_HTTP_C} server CPU <= 150 us/request", us,
                               us <= 150, "ingress + batcher + replicas + HTTP front"))
    for model in results["models"]:
        if (p := _point(results, model, LATENCY_C)) is None:
            continue
        for path in ("handle", "http"):
            ours, theirs = p.get(path, {}).get(rb), p.get(path, {}).get(BASELINE)
            if ours and theirs:
                x = _ratio(ours["p50_ms"], theirs["p50_ms"])
                out.append(_target(f"{rb} {model} {path} C={LATENCY_C} p50 <= @serve.batch's", x,
                                   None if x is None else x <= 1.0,
                                   f"{ours['p50_ms']:.2f} vs {theirs['p50_ms']:.2f} ms"))
    if (p := _point(results, "minilm", MINILM_C)) is not None:
        offline = p["ceiling_items_per_s"]
        rps = _rps(p, "http", rb)
        out.append(_at_least(f"{rb} minilm HTTP C={MINILM_C} >= 0.85 of offline encode",
                             _ratio(rps, offline), 0.85, f"{rps or 0:,.0f} of {offline:,.0f}"))
    return out


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The product-path targets for each Raybatch variant, each with its measured value (None:
    not measured in this run)."""
    return [t for rb in _variants(results) for t in _variant_targets(results, rb)]


def render(results: dict[str, Any]) -> str:
    head = (f"{'model':<7}{'path':<7}{'C':>4}  {'system':<21}{'req/s':>8}{'vs @batch':>10}"
            f"{'%ceil':>7}{'p50 ms':>8}{'p99 ms':>9}{'batch':>7}{'client':>8}{'own+fr':>8}"
            f"{'all':>7}{'load':>6}")
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
    lines.append("CPU us per request: client = the load generator (wrk, or this process for "
                 "handles); own+fr = the system's own processes plus the HTTP front (Serve "
                 "proxy or HAProxy); all = every Ray process; load: 1-minute load average")
    lines += _cpu_breakdown(results)
    lines.append("")
    for t in results["targets"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[t["passed"]]
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        lines.append(f"{verdict}  {t['name']}: {value}  {t['detail']}".rstrip())
    return "\n".join(lines)


TARGET_POINTS = (("sleep", "handle", SLEEP_C), ("mlp", "handle", SLEEP_C),
                 ("sleep", "http", SLEEP_C), ("mlp", "http", MLP_HTTP_C),
                 ("minilm", "http", MINILM_C))


def _cpu_breakdown(results: dict[str, Any]) -> list[str]:
    """Where the servers' CPU goes at the targets' points: us per request, by Ray process."""
    lines = []
    for model, path, c in TARGET_POINTS:
        p = _point(results, model, c)
        if p is None or path not in p:
            continue
        lines.append(f"CPU by process group, {model} {path} C={c} (us/request):")
        for system, r in p[path].items():
            top = list(r.get("cpu_us_per_req_by_group", {}).items())[:6]
            parts = [f"{name} {us:.0f}" for name, us in top]
            lines.append(f"  {system:<21}" + ", ".join(parts))
    return lines


def _row(model: str, path: str, p: dict[str, Any], system: str, r: dict[str, Any]) -> str:
    ceiling = p["ceiling_items_per_s"]
    base = _rps(p, path, BASELINE)
    ratio = _ratio(r["throughput_rps"], base)
    err = f"  ERRORS {r['errors']}: {r['first_error']}" if r["errors"] else ""
    server = r.get("server_cpu_us_per_req")
    own = r.get("own_and_front_cpu_us_per_req")
    return (f"{model:<7}{path:<7}{p['concurrency']:>4}  {system:<21}{r['throughput_rps']:>8,.0f}"
            f"{'' if ratio is None else f'{ratio:.2f}x':>10}{r['throughput_rps'] / ceiling:>7.0%}"
            f"{r['p50_ms']:>8.2f}{r['p99_ms']:>9.2f}{r['mean_batch_size'] or 0:>7.1f}"
            f"{r['client_cpu_us_per_req']:>8.0f}{'-' if own is None else f'{own:.0f}':>8}"
            f"{'-' if server is None else f'{server:.0f}':>7}{p['loadavg_1m']:>6.2f}{err}")
