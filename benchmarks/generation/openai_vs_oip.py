"""OpenAI streams against OIP generate_stream: the same generations through each, one run.

    python -m benchmarks.generation.openai_vs_oip [--streams 200] [--max-tokens 48]
        [--rounds 8] [--seed 0] [--front native|serve] [--json OUT] [--py-spy DIR]

Starts the product as its users do, `raybatch up --config FILE` (its own process session,
free ports for Serve's HTTP front, the native front and gRPC; ready when it prints "Stop
with Ctrl-C" and `tinylm` answers ready; stopped with Ctrl-C, SIGINT, at the end). FILE is
the demo config (deployments/configs/demo.yaml), written to a temp file with one change a
single load generator needs: `ingress.max_streams_per_client` raised from 16 (which bounds
one client address) to 4x the streams, at least 1024. The model is the demo's `tinylm`
(continuous batching, max_active 32, its engine and replica in the ingress process).

A round is `--streams` streams started at once by one aiohttp client in this process (a
connection each), every one read to its end: a fixed prompt each (cut from TinyLM's text
by `benchmarks.generation.continuous.workload`, seeded), greedy decoding (`temperature:
0`) and the same `max_tokens`, through one series:
  oip          POST /v2/models/tinylm/generate_stream; tokens: the final event's num_tokens
  chat         POST /v1/chat/completions, stream, include_usage (the prompt as one user
               message); tokens: usage.completion_tokens
  completions  POST /v1/completions, the same; tokens: usage.completion_tokens
  oip-chat     generate_stream of chat's prompt as the chat template renders it, with
               the template's stop string: the same generations as chat, through OIP
tokens/s = the round's tokens / its wall time; TTFT = from sending a request to its first
event with text. Every answer is checked before a round counts: HTTP 200, the final event
(oip) or `data: [DONE]` after a usage chunk (OpenAI), no error event. A warm-up round of
each series checks every prompt: completions' text and tokens equal oip's, chat's equal
oip-chat's; every timed round must give the warm-up's texts and tokens again.

Timed rounds alternate the series (`--rounds` cycles, each rotating the order: oip, chat,
completions, oip-chat; chat, completions, oip-chat, oip; ...). Reported per series: the
median tokens/s, TTFT p50/p99 over all its streams, and CPU seconds per 1k tokens of the
ingress replica's process (HTTP, engine and TinyLM all run there), of every process
`raybatch up` started (from /proc) and of this client; then, against the target 0.9
(PASS/MISS), the median tokens/s of each OpenAI series over the same load through
generate_stream: completions/oip (the same prompts) and chat/oip-chat (the same rendered
prompts); chat/oip is shown too, for what a chat's longer prompt costs the model. Also the
machine (CPU model, cores, load average) and the CPU others used meanwhile (the machine's
busy time less ours). `--py-spy DIR`: after the timed rounds, 3 more rounds of each series
with py-spy sampling the ingress process, collapsed stacks to DIR. About 1.5 minutes on
2 cores with the defaults, a third of it starting Ray and warming up. Run it under the Ray lock
where others share the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import yaml

from benchmarks.common.results import save_json
from benchmarks.common.up import interrupt, start, wait_started
from benchmarks.generation.continuous import workload
from benchmarks.generation.over_http import machine_busy_s
from benchmarks.peers.measure import proc_table
from benchmarks.serve.drivers import cpu_by_group, descendants, tree_cpu_s
from deployments.protocol.openai import ChatTemplate

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "deployments/configs/demo.yaml"
MODEL = "tinylm"
APIS = ("oip", "chat", "completions")
SERIES = ("oip", "chat", "completions", "oip-chat")  # oip-chat: a diagnostic (`bodies`)
KIND = {"oip": "oip", "chat": "chat", "completions": "completions", "oip-chat": "oip"}
TARGET = 0.9
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class Answer:
    """One stream as the client read it."""

    prompt: int
    ttft_s: float | None
    text: str
    tokens: int | None
    error: str | None = None


# -- the product, started as its users start it ------------------------------------------------
def demo_config(tmp: Path, streams: int) -> tuple[Path, str]:
    """The demo config with only `ingress.max_streams_per_client` raised; (path, app name)."""
    cfg = yaml.safe_load(DEMO.read_text())
    cfg["ingress"]["max_streams_per_client"] = max(1024, 4 * streams)
    path = tmp / "demo-one-client.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path, cfg.get("app_name", "raybatch")


# -- requests and answers ---------------------------------------------------------------------
def request(api: str, prompt: str, max_tokens: int, stop: list[str] | None = None
            ) -> tuple[str, bytes]:
    """(path, body) of one greedy stream of `prompt` through `api`."""
    if api == "oip":
        params: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0}
        if stop:
            params["stop"] = stop
        return (f"/v2/models/{MODEL}/generate_stream",
                orjson.dumps({"text_input": prompt, "parameters": params}))
    doc: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0,
                           "stream": True, "stream_options": {"include_usage": True}}
    if api == "chat":
        doc["messages"] = [{"role": "user", "content": prompt}]
        return "/v1/chat/completions", orjson.dumps(doc)
    doc["prompt"] = prompt
    return "/v1/completions", orjson.dumps(doc)


def read_event(api: str, event: dict[str, Any]) -> tuple[str, int | None]:
    """(text, tokens if this event ends the count) of one parsed SSE event."""
    if api == "oip":
        if event.get("final"):
            return "", int(event["num_tokens"])
        return event.get("text_output") or "", None
    if not event["choices"]:  # the usage chunk
        return "", int(event["usage"]["completion_tokens"])
    choice = event["choices"][0]
    piece = choice["delta"].get("content") if api == "chat" else choice["text"]
    return piece or "", None


async def one_stream(session: Any, url: str, api: str, index: int, body: bytes) -> Answer:
    t0 = time.perf_counter()
    ttft, pieces, tokens, done = None, [], None, False
    try:
        async with session.post(url, data=body, headers=JSON_HEADERS) as r:
            if r.status != 200:
                return Answer(index, None, "", None, f"HTTP {r.status}: {(await r.read())[:200]!r}")
            async for line in r.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if done:
                    return Answer(index, ttft, "", None, f"an event after the end: {data[:80]!r}")
                if data == b"[DONE]":
                    done = True
                    continue
                event = orjson.loads(data)
                if "error" in event:
                    return Answer(index, ttft, "", None, f"error event: {event['error']}")
                piece, count = read_event(api, event)
                if piece:
                    ttft = ttft or time.perf_counter() - t0
                    pieces.append(piece)
                if count is not None:
                    tokens, done = count, done or api == "oip"
    except (OSError, asyncio.TimeoutError) as e:  # aiohttp.ClientError is an OSError
        return Answer(index, ttft, "", None, f"{type(e).__name__}: {e}")
    if not done or tokens is None:
        return Answer(index, ttft, "", None, "the stream ended without its final event"
                      + ("" if api == "oip" else " / usage chunk / [DONE]"))
    return Answer(index, ttft, "".join(pieces), tokens)


async def one_round(session: Any, base: str, api: str, bodies: list[tuple[str, bytes]]
                    ) -> tuple[list[Answer], float]:
    """Every stream of the round at once; (answers, wall seconds)."""
    t0 = time.perf_counter()
    answers = await asyncio.gather(*(one_stream(session, base + path, api, i, body)
                                     for i, (path, body) in enumerate(bodies)))
    return answers, time.perf_counter() - t0


def check(answers: list[Answer], expected: list[Answer] | None, what: str) -> None:
    """Raise on any failed stream, or a text or token count other than `expected`'s."""
    bad = [f"#{a.prompt}: {a.error}" for a in answers if a.error]
    if expected is not None:
        bad += [f"#{a.prompt}: {a.tokens} tokens {a.text[:40]!r}, expected {e.tokens} "
                f"{e.text[:40]!r}" for a, e in zip(answers, expected)
                if not a.error and (a.text, a.tokens) != (e.text, e.tokens)]
    if bad:
        raise RuntimeError(f"{what}: {len(bad)} of {len(answers)} streams wrong, e.g. "
                           + "; ".join(bad[:3]))


# -- CPU ---------------------------------------------------------------------------------------
def cpu_now(root: int, app: str) -> dict[str, float]:
    """CPU seconds so far: the ingress replica, all of `raybatch up`'s processes, this
    client, the whole machine."""
    groups = cpu_by_group(tree_cpu_s(root))
    me = resource.getrusage(resource.RUSAGE_SELF)
    return {"ingress_s": sum(v for g, v in groups.items() if g.startswith(f"{app}/")),
            "raybatch_s": sum(groups.values()) + proc_table()[root].cpu_s,
            "client_s": me.ru_utime + me.ru_stime, "machine_s": machine_busy_s()}


def round_figures(api: str, answers: list[Answer], wall_s: float, c0: dict[str, float],
                  c1: dict[str, float]) -> dict[str, Any]:
    d = {k: c1[k] - c0[k] for k in c0}
    tokens = sum(a.tokens or 0 for a in answers)
    ttft_ms = [a.ttft_s * 1e3 for a in answers if a.ttft_s is not None]
    others = max(0.0, d["machine_s"] - d["raybatch_s"] - d["client_s"])
    return {"api": api, "streams": len(answers), "tokens": tokens, "wall_s": wall_s,
            "tokens_per_s": tokens / wall_s, "ttft_ms": ttft_ms,
            "ingress_cpu_s": d["ingress_s"], "raybatch_cpu_s": d["raybatch_s"],
            "client_cpu_s": d["client_s"], "others_cores": others / wall_s,
            "loadavg_1m": os.getloadavg()[0]}


def summary(rounds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for api in SERIES:
        rs = [r for r in rounds if r["api"] == api]
        tokens = sum(r["tokens"] for r in rs)
        ttft = [t for r in rs for t in r["ttft_ms"]]
        per_1k = {k: 1e3 * sum(r[f"{k}_cpu_s"] for r in rs) / tokens
                  for k in ("ingress", "raybatch", "client")}
        out[api] = {"rounds": len(rs), "tokens_per_s": float(np.median(
                    [r["tokens_per_s"] for r in rs])),
                    "runs_tokens_per_s": [round(r["tokens_per_s"]) for r in rs],
                    "tokens_per_round": rs[0]["tokens"],
                    "ttft_p50_ms": float(np.percentile(ttft, 50)),
                    "ttft_p99_ms": float(np.percentile(ttft, 99)),
                    **{f"{k}_cpu_s_per_1k_tokens": v for k, v in per_1k.items()}}
    return out


def ratios(by_api: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each OpenAI series over the same generations through generate_stream (the target),
    and chat over the plain prompts (what the chat template's longer prompt costs)."""
    out = {}
    for name, over in (("completions", "oip"), ("chat", "oip-chat")):
        r = by_api[name]["tokens_per_s"] / by_api[over]["tokens_per_s"]
        out[f"{name}/{over}"] = {"tokens_per_s": r, "target": TARGET,
                                 "verdict": "PASS" if r >= TARGET else "MISS"}
    out["chat/oip"] = {"tokens_per_s": by_api["chat"]["tokens_per_s"]
                       / by_api["oip"]["tokens_per_s"]}
    return out


# -- the run -----------------------------------------------------------------------------------
_T0 = time.perf_counter()


def progress(line: str) -> None:
    print(f"[{time.perf_counter() - _T0:5.0f} s] {line}", file=sys.stderr, flush=True)


def bodies(prompts: list[str], max_tokens: int) -> dict[str, list[tuple[str, bytes]]]:
    """Each series' requests, prompt by prompt; `oip-chat` is OIP generate_stream of the
    chat prompt as the template renders it, with the template's stop: chat's own work."""
    template = ChatTemplate()  # the demo sets no chat_template: the default one
    out = {api: [request(api, p, max_tokens) for p in prompts] for api in APIS}
    out["oip-chat"] = [request("oip", template.render([("user", p)]), max_tokens,
                               list(template.stop)) for p in prompts]
    return out


async def warm_up(session: Any, base: str, sent: dict[str, list[tuple[str, bytes]]]
                  ) -> dict[str, list[Answer]]:
    """One round of each series, checked against each other; the answers each must repeat."""
    seen = {}
    for name in SERIES:
        seen[name], _ = await one_round(session, base, KIND[name], sent[name])
        check(seen[name], None, f"warm-up {name}")
    check(seen["completions"], seen["oip"], "completions against oip")
    check(seen["chat"], seen["oip-chat"], "chat against oip of its rendered prompt")
    return seen


async def timed_round(session: Any, base: str, name: str, sent: list[tuple[str, bytes]],
                      expected: list[Answer], root: int, app: str) -> dict[str, Any]:
    c0 = cpu_now(root, app)
    answers, wall = await one_round(session, base, KIND[name], sent)
    c1 = cpu_now(root, app)
    check(answers, expected, f"a timed round of {name}")
    r = round_figures(name, answers, wall, c0, c1)
    progress(f"{name:<12}{r['tokens_per_s']:>8,.0f} tokens/s  {r['wall_s']:5.2f} s  ingress "
             f"{r['ingress_cpu_s']:5.2f} s  client {r['client_cpu_s']:5.2f} s  others "
             f"{r['others_cores']:4.2f} cores  load {r['loadavg_1m']:.2f}")
    return r


async def measure(args: argparse.Namespace, base: str, root: int, app: str
                  ) -> list[dict[str, Any]]:
    import aiohttp

    prompts = [j.prompt for j in workload(args.streams, 0.0, args.seed, corpus())]
    sent = bodies(prompts, args.max_tokens)
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)  # every stream at once
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        expected = await warm_up(session, base, sent)
        progress("warm-up checked: completions = oip, chat = oip of its rendered prompt")
        rounds = []
        for k in range(args.rounds):
            n = k % len(SERIES)
            for name in SERIES[n:] + SERIES[:n]:
                rounds.append(await timed_round(session, base, name, sent[name],
                                                expected[name], root, app))
        if args.py_spy:
            await profile(session, base, sent, ingress_pid(root, app), Path(args.py_spy))
    return rounds


# -- where the ingress's time goes (--py-spy) ----------------------------------------------------
def ingress_pid(root: int, app: str) -> int:
    for pid in descendants(root):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(f"ray::ServeReplica:{app}:".encode()):
            return pid
    raise RuntimeError(f"no ingress replica process of app {app!r} under pid {root}")


async def profile(session: Any, base: str, sent: dict[str, list[tuple[str, bytes]]],
                  pid: int, out: Path, rounds: int = 3) -> None:
    """After the timed rounds (py-spy slows what it samples): `rounds` rounds of each series
    under `py-spy record --nonblocking` of the ingress process; collapsed stacks to
    OUT/<series>.txt (flamegraph.pl or speedscope read them)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in SERIES:
        spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                                str(pid), "--rate", "200", "--nonblocking", "--format", "raw",
                                "--output", str(out / f"{name}.txt")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(1.0)  # attached
        for _ in range(rounds):
            await one_round(session, base, KIND[name], sent[name])
        spy.send_signal(signal.SIGINT)
        await asyncio.to_thread(spy.wait, 30)
        progress(f"py-spy of {name}: {out / f'{name}.txt'}")


def corpus() -> str:
    from deployments.models.tinylm import CORPUS

    return " ".join(CORPUS.read_text().split())


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo
                  if line.startswith("model name")), platform.processor())
    return {"cpu": model, "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "loadavg_start": os.getloadavg()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"command": " ".join(["python -m benchmarks.generation."
                                                   "openai_vs_oip", *sys.argv[1:]]),
                              "settings": vars(args), "machine": machine()}
    with tempfile.TemporaryDirectory(prefix="openai-vs-oip-") as tmp:
        config, app = demo_config(Path(tmp), args.streams)
        result["config_change"] = {"ingress.max_streams_per_client": max(1024, 4 * args.streams)}
        t0 = time.perf_counter()
        proc, log, ports = start(config, Path(tmp))
        try:
            port = ports["native_port" if args.front == "native" else "port"]
            base = f"http://127.0.0.1:{port}"
            wait_started(proc, log, f"{base}/v2/models/{MODEL}/ready", 600)
            progress(f"raybatch up ready in {time.perf_counter() - t0:.0f} s; {base}")
            result["rounds"] = asyncio.run(measure(args, base, proc.pid, app))
        finally:
            t1 = time.perf_counter()
            interrupt(proc)
            progress(f"raybatch up stopped (Ctrl-C) in {time.perf_counter() - t1:.0f} s")
    result["machine"]["loadavg_end"] = os.getloadavg()
    result["by_api"] = summary(result["rounds"])
    result["ratios"] = ratios(result["by_api"])
    for r in result["rounds"]:  # each stream's TTFT went into by_api; a round keeps its own
        ttft = r.pop("ttft_ms")
        r["ttft_p50_ms"], r["ttft_p99_ms"] = np.percentile(ttft, [50, 99]).tolist()
    return result


def render(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [f"$ {result['command']}",
             f"machine: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), Python "
             f"{m['python']}; load average {m['loadavg_start'][0]:.2f} -> "
             f"{m['loadavg_end'][0]:.2f}",
             "", "| series | tokens/s (median) | tokens/s of each round, in order | TTFT p50 ms "
             "| TTFT p99 ms | CPU s per 1k tokens: ingress | all of raybatch up | client |",
             "|---|---|---|---|---|---|---|---|"]
    for api, r in result["by_api"].items():
        runs = " / ".join(f"{x:,}" for x in r["runs_tokens_per_s"])
        lines.append(f"| {api} | {r['tokens_per_s']:,.0f} | {runs}"
                     f" | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | "
                     f"{r['ingress_cpu_s_per_1k_tokens']:.3f} | "
                     f"{r['raybatch_cpu_s_per_1k_tokens']:.3f} | "
                     f"{r['client_cpu_s_per_1k_tokens']:.3f} |")
    lines.append("")
    for name, r in result["ratios"].items():
        verdict = f" (target >= {r['target']}) {r['verdict']}" if "target" in r else \
            " (information: chat's rendered prompts are longer than oip's)"
        lines.append(f"{name}: {r['tokens_per_s']:.2f}x{verdict}")
    others = [r["others_cores"] for r in result["rounds"]]
    lines.append(f"others' CPU during the rounds: {min(others):.2f}-{max(others):.2f} cores")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=200, help="concurrent streams per round")
    p.add_argument("--max-tokens", type=int, default=48, help="every stream's max_tokens")
    p.add_argument("--rounds", type=int, default=8, help="timed rounds per series, alternated")
    p.add_argument("--seed", type=int, default=0, help="of the prompts")
    p.add_argument("--front", choices=("native", "serve"), default="native",
                   help="Raybatch's own HTTP server in the ingress (the demo's native_port), "
                        "or Serve's HTTP front")
    p.add_argument("--json", default=None, help="write the figures to this path")
    p.add_argument("--py-spy", default=None, metavar="DIR",
                   help="after the timed rounds, profile the ingress per series into DIR")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    print(render(result))
    save_json(args.json, result)


if __name__ == "__main__":
    main()
