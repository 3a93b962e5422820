"""Argument types of the command line: a wrong value is refused by argparse, with the
command's usage and what to give, before anything starts."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def port_number(none: bool = False) -> Callable[[str], int]:
    """A TCP port, 1..65535 (0 too, meaning none, where `none`)."""
    def port(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if not (0 if none else 1) <= value <= 65535:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a port: give 1..65535{', or 0 for none' if none else ''}")
        return value

    return port


def positive(kind: type = float) -> Callable[[str], float]:
    """A number above 0 (`kind`: int or float)."""
    return _bounded(kind, lambda v: v > 0, "above 0")


def non_negative(kind: type = float) -> Callable[[str], float]:
    """A number of 0 or more (`kind`: int or float)."""
    return _bounded(kind, lambda v: v >= 0, "0 or more")


def at_least(minimum: float, kind: type = float) -> Callable[[str], float]:
    """A number of `minimum` or more: a floor where less would be a busy loop."""
    return _bounded(kind, lambda v: v >= minimum, f"of {minimum:g} or more")


def between(low: float, high: float, kind: type = float) -> Callable[[str], float]:
    """A number from `low` to `high`: where more would take the machine's memory."""
    return _bounded(kind, lambda v: low <= v <= high, f"from {low:,} to {high:,}")


def _bounded(kind: type, ok: Callable[[float], bool], words: str) -> Callable[[str], float]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or not ok(value):
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r}: give {what} {words}")
        return value

    parse.__name__ = kind.__name__
    return parse


def ray_address(text: str) -> str:
    """A Ray cluster's address as `ray.init` and `ray start` take it: HOST:PORT of the
    head's GCS (an IPv6 host in brackets), `auto` (the cluster this machine runs, or
    $RAY_ADDRESS), or ray://HOST:PORT (Ray Client). Anything else Ray would refuse with a
    traceback, or wait on for a minute."""
    if text == "auto":
        return text
    rest = text.removeprefix("ray://")
    host, colon, port = rest.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]") and len(host) > 2
    ok = (colon and host and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535
          and not any(c.isspace() or c in "/?#@" for c in rest)
          and (bracketed or ("[" not in host and "]" not in host and ":" not in host)))
    if not ok:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Ray address: give HOST:PORT of the head's GCS (e.g. "
            "10.0.0.1:6379), auto, or ray://HOST:PORT")
    return text

