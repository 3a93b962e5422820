"""The comparison's table: one row per system and request kind, ratios from the same run.

"Raybatch ÷ it" is Raybatch's req/s at C=128 over the row's, with the Raybatch row of
the same kind: raw-byte bodies (OIP binary, msgpack) against Raybatch's OIP binary,
JSON bodies against its OIP JSON. Above 1, Raybatch serves more; below, fewer. The
targets Raybatch holds itself to against these peers are evaluated from the same rows.
A row whose answer was wrong, or whose server did not start, shows why instead of
numbers: it was not timed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]


def raybatch_row(rows: Sequence[Row], kind: str) -> Row | None:
    return next((r for r in rows if r["system"] == "raybatch" and r["kind"] == kind
                 and r.get("c128")), None)


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """ours ÷ theirs, None unless both are positive numbers."""
    if not ours or not theirs or ours <= 0 or theirs <= 0:
        return None
    return ours / theirs


def rps(row: Row | None) -> float | None:
    return row["c128"]["throughput_rps"] if row and row.get("c128") else None


def p50_c1(row: Row | None) -> float | None:
    return row["c1"]["p50_ms"] if row and row.get("c1") else None


def with_ratios(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Each row with `raybatch_over_it`: Raybatch's req/s ÷ the row's (same kind)."""
    out = []
    for r in rows:
        rb = raybatch_row(rows, r["kind"])
        out.append({**r, "raybatch_over_it": ratio(rps(rb), rps(r))})
    return out


def find(rows: Sequence[Row], system: str, kind: str) -> Row | None:
    return next((r for r in rows if r["system"] == system and r["kind"] == kind), None)


def targets(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The targets against the peers, each with its measured value and whether it is met (None:
    not measured)."""
    rb_bin, rb_json = raybatch_row(rows, "binary"), raybatch_row(rows, "json")
    tr_bin, tr_json = find(rows, "triton", "binary"), find(rows, "triton", "json")
    mo_bin = find(rows, "mosec", "binary")
    sb = find(rows, "serve.batch", "binary")
    out = []

    def at_least(name: str, value: float | None, bound: float) -> None:
        out.append({"target": name, "value": value, "bound": bound,
                    "met": None if value is None else value >= bound})

    def at_most(name: str, value: float | None, bound: float) -> None:
        out.append({"target": name, "value": value, "bound": bound,
                    "met": None if value is None else value <= bound})

    at_least("Raybatch OIP binary ÷ Triton OIP binary (req/s, C=128) >= 1.0",
             ratio(rps(rb_bin), rps(tr_bin)), 1.0)
    at_least("Raybatch OIP binary ÷ mosec msgpack (req/s, C=128) >= 0.8",
             ratio(rps(rb_bin), rps(mo_bin)), 0.8)
    at_least("Raybatch OIP JSON ÷ Triton OIP JSON (req/s, C=128) >= 1.0",
             ratio(rps(rb_json), rps(tr_json)), 1.0)
    at_least("Raybatch OIP binary ÷ @serve.batch (req/s, C=128) >= 3.0",
             ratio(rps(rb_bin), rps(sb)), 3.0)
    for peer, label in ((tr_bin, "Triton OIP binary"), (mo_bin, "mosec msgpack")):
        ours, theirs = p50_c1(rb_bin), p50_c1(peer)
        at_most(f"Raybatch OIP binary C=1 p50 <= {label}'s",
                None if ours is None or theirs is None else ours - theirs, 0.0)
    # the shipped shape (a batching actor and a replica actor) against the in-process one
    inproc = find(rows, "raybatch.inproc", "binary")
    at_least("actor shape ÷ in-process shape, OIP binary (req/s, C=128) >= 0.9",
             ratio(rps(rb_bin), rps(inproc)), 0.9)
    at_least("actor shape OIP binary ÷ mosec msgpack (req/s, C=128) >= 1.2",
             ratio(rps(rb_bin), rps(mo_bin)), 1.2)
    at_least("actor shape OIP JSON ÷ Triton OIP JSON (req/s, C=128) >= 1.5",
             ratio(rps(rb_json), rps(tr_json)), 1.5)
    lone = p50_c1(rb_bin)
    at_most("actor shape OIP binary C=1 p50 <= 1.0 ms", lone, 1.0)
    at_most("actor shape ÷ in-process shape, OIP binary C=1 p50 <= 1.25",
            ratio(lone, p50_c1(inproc)), 1.25)
    return out


def _num(v: float | None, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def render(rows: Sequence[Row]) -> str:
    """The Markdown table (rows in the order measured) and the targets below it."""
    head = ("| system | request | req/s, C=128 | p50 / p99 ms, C=128 | p50 ms, C=1 "
            "| server CPU µs/req, C=128 | mean batch | load (1 min) | Raybatch ÷ it |")
    lines = [head, "|" + "---|" * 9]
    for r in with_ratios(rows):
        if r.get("error"):
            lines.append(f"| {r['title']} | {r['request']} | {r['error']} "
                         "| – | – | – | – | – | – |")
            continue
        a, b = r.get("c128") or {}, r.get("c1") or {}
        errs = a.get("errors", 0) + b.get("errors", 0)
        note = f" ({errs} errors)" if errs else ""
        ratio_s = "1" if r["system"] == "raybatch" else _num(r["raybatch_over_it"], ".2f") + "×"
        lines.append(
            f"| {r['title']} | {r['request']} | {_num(a.get('throughput_rps'), ',.0f')}{note} "
            f"| {_num(a.get('p50_ms'), '.2f')} / {_num(a.get('p99_ms'), '.2f')} "
            f"| {_num(b.get('p50_ms'), '.2f')} "
            f"| {_num(a.get('server_cpu_us_per_req'), ',.0f')} "
            f"| {_num(a.get('mean_batch'), '.1f')} "
            f"| {_num((a.get('loadavg') or [None])[0], '.2f')} | {ratio_s} |")
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for t in targets(rows):
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        unit = (" ms" if t["target"].endswith(" ms") else "×" if "÷" in t["target"]
                else " ms (difference)")
        lines.append(f"| {t['target']} | {_num(t['value'], '.2f')}{unit} | {met} |")
    return "\n".join(lines)
