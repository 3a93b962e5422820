"""`raybatch simulate` and `python -m batching.simulate`: the simulator from the command line.

Flags describe an arrival process, replicas whose batches take `a + b·cost`, and a
dynamic policy; the report is printed as text or JSON. Bad settings end with a
one-line message and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from batching.dynamic.policy import DynamicPolicy
from batching.simulate.arrivals import Arrivals, Bursts, ClosedLoop, Poisson, Trace
from batching.simulate.engine import MAX_EVENTS, simulate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's options to `parser` (the `raybatch simulate` subcommand)."""
    group = parser.add_argument_group("arrivals (pick one)")
    src = group.add_mutually_exclusive_group(required=True)
    src.add_argument("--rate", type=_positive(float), help="Poisson arrivals, requests/s")
    src.add_argument("--bursts", type=_bursts, metavar="SIZE:PERIOD",
                     help="SIZE requests at once every PERIOD seconds, e.g. 64:0.1")
    src.add_argument("--trace", type=Path, metavar="FILE",
                     help="arrival times, one per line, in seconds from the start")
    src.add_argument("--concurrency", type=_positive(int), metavar="C",
                     help="closed loop: C clients, each sends when its last request ended")
    add = parser.add_argument
    add("--think-ms", type=float, default=0.0, help="closed loop: pause before sending again")
    add("--duration", type=_positive(float), help="seconds of arrivals (default 10; trace: all)")
    add("--num-requests", type=_positive(int), help="stop sending after this many requests")
    add("--warmup", type=float, default=0.0, help="seconds left out of the measurements")
    add("--replicas", type=_positive(int), default=1)
    add("--max-inflight", type=_positive(int), default=1, help="batches queued per replica")
    add("--latency-a-ms", type=float, default=2.0, help="fixed time of a batch on a replica")
    add("--latency-b-ms", type=float, default=0.05, help="time per unit of cost (per item)")
    add("--hop-ms", type=float, default=0.0, help="one-way host-to-replica call latency")
    add("--jitter", type=float, default=0.0, help="sigma of a log-normal factor on compute")
    add("--max-batch-size", type=_positive(int), default=32)
    add("--max-queue-delay-ms", type=float, default=0.0)
    add("--idle-dispatch", action="store_true",
        help="send at once when no batch is in flight (the delay applies only under load)")
    add("--fill-while-busy", action="store_true",
        help="while every replica runs a batch, keep filling the next one past the delay "
             "until the first running batch is predicted to end")
    add("--preferred", type=_sizes, default=(), metavar="8,16", help="preferred batch sizes")
    add("--items-per-request", type=_positive(int), default=1)
    add("--timeout-ms", type=_positive(float), help="every request's queue timeout")
    add("--seed", type=int, default=0)
    add("--max-events", type=_positive(int), default=MAX_EVENTS,
        help=f"stop with an error past this many events (default {MAX_EVENTS:,}: a run's "
             "memory and time follow its events)")
    add("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Run the simulation `args` describe and print its report; returns the exit code."""
    try:
        report = simulate(_policy(args), _arrivals(args), **_options(args))
    except ValidationError as e:  # the policy's settings: one line each
        print("simulate: " + "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
                                       for err in e.errors()), file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:  # bad settings or an unreadable trace: no traceback
        print(f"simulate: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.format())
    return 0


def _policy(args: argparse.Namespace) -> DynamicPolicy:
    return DynamicPolicy(
        max_batch_size=args.max_batch_size,
        max_queue_delay_s=args.max_queue_delay_ms / 1e3,
        idle_dispatch=args.idle_dispatch,
        fill_while_busy=args.fill_while_busy,
        preferred_batch_sizes=args.preferred,
    )


def _arrivals(args: argparse.Namespace) -> Arrivals:
    if args.rate is not None:
        return Poisson(args.rate)
    if args.bursts is not None:
        return Bursts(*args.bursts)
    if args.trace is not None:
        return Trace.from_file(args.trace)
    return ClosedLoop(args.concurrency, think_s=args.think_ms / 1e3)


def _options(args: argparse.Namespace) -> dict:
    duration = args.duration
    if duration is None and args.trace is None and args.num_requests is None:
        duration = 10.0
    return dict(
        replicas=args.replicas,
        latency_a_s=args.latency_a_ms / 1e3,
        latency_b_s=args.latency_b_ms / 1e3,
        max_inflight=args.max_inflight,
        hop_s=args.hop_ms / 1e3,
        jitter=args.jitter,
        items_per_request=args.items_per_request,
        timeout_s=None if args.timeout_ms is None else args.timeout_ms / 1e3,
        duration_s=duration,
        num_requests=args.num_requests,
        warmup_s=args.warmup,
        seed=args.seed,
        max_events=args.max_events,
    )


def _positive(kind: type) -> Callable[[str], float]:
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} must be > 0")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its error messages
    return parse


def _bursts(text: str) -> tuple[int, float]:
    try:
        size, period = text.split(":")
        return int(size), float(period)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not SIZE:PERIOD, e.g. 64:0.1") from None


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of sizes, e.g. 8,16") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batching.simulate",
                                     description="Simulate a dynamic batching policy.")
    add_arguments(parser)
    return run(parser.parse_args(argv))

