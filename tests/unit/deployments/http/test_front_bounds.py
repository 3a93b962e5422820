"""The native front against the Python server at their limits, byte for byte: requests built
(a fixed seed) around each bound the two must draw in the same place. A URL and header
bytes around `max_header_bytes`, heads of many tiny fields around the bound on a head,
chunked requests around a head's bound with and without trailers (a trailer near the
limit), `Expect: 100-continue` bodies past what the front hands over ahead of the app,
pipelined behind other requests, and bodies past `max_body_bytes`. Each on a connection of
its own, then a half-close: every byte the two send back must be equal.
"""

from __future__ import annotations

import random

import pytest

from deployments.http.native.front import available
from tests.unit.deployments.http.served import request
from tests.unit.deployments.http.test_front import binary
from tests.unit.deployments.http.test_front_requests import both_servers, chunked

pytestmark = pytest.mark.skipif(not available(), reason="the native front is not compiled "
                                "(needs a C compiler): run `make setup` with gcc installed")

SEED = 20_261_129
CASES = 240
LIMIT = 16 * 1024  # max_header_bytes of both servers
LIVE = request("GET", "/v2/health/live")


def _chunked(rng: random.Random) -> bytes:
    raw = binary([1.0] * rng.randrange(8000, 11000))  # 32-44 KB: about a head's bound
    step = rng.choice([100, 4096, 30000])
    trailer = rng.choice([b"", b"x-t: 1\r\n",
                          b"x-big: " + b"t" * rng.randrange(1000, 17000) + b"\r\n"])
    return chunked(raw, step, trailer) + rng.choice([b"", LIVE])


def cases(rng: random.Random) -> list[bytes]:
    out = []
    for _ in range(CASES):
        kind = rng.randrange(6)
        if kind == 0:  # a URL around the limit
            out.append(request("GET", "/v2/health/live?" + "a" * (LIMIT + rng.randrange(-40, 40))))
        elif kind == 1:  # header bytes around the limit, in one field or many
            n = rng.randrange(1, 60)
            per = (LIMIT + rng.randrange(-300, 300)) // n
            out.append(request("GET", "/v2/health/live",
                               headers={f"x-{i}": "v" * per for i in range(n)}))
        elif kind == 2:  # many tiny fields: a head past its bound on few header bytes
            n = rng.choice([3000, 5000, 7000, 9000])
            out.append(request("GET", "/v2/health/live", headers={f"{i}": "" for i in range(n)}))
        elif kind == 3:
            out.append(_chunked(rng))
        elif kind == 4:  # Expect with its body sent at once, behind a request, maybe twice
            raw = binary([2.0] * rng.randrange(1, 20000))
            raw = raw.replace(b"\r\n\r\n", b"\r\nexpect: 100-continue\r\n\r\n", 1)
            out.append(LIVE + raw + rng.choice([b"", binary([3.0]), raw]))
        else:  # a body past max_body_bytes (64 MiB), some of it sent
            out.append(b"POST /v2/models/square/infer HTTP/1.1\r\nhost: h\r\n"
                       b"content-length: %d\r\n\r\n" % rng.choice([2**26 + 1, 2**30])
                       + b"x" * rng.randrange(0, 200_000))
    return out


def test_the_front_draws_every_bound_where_the_python_server_does():
    sent = cases(random.Random(SEED))
    python, front, stats = both_servers(sent, max_header_bytes=LIMIT)
    differ = [i for i, (a, b) in enumerate(zip(python, front)) if a != b]
    for i in differ[:3]:
        print("case", i, sent[i][:200], "\nthe Python server:", python[i][:300],
              "\nthe front:", front[i][:300])
    assert not differ, f"{len(differ)} of {len(sent)} cases answered differently: {differ}"
    # each way through the front was taken: whole, streamed, refused
    assert min(stats["requests"], stats["streamed"], stats["refusals"]) > 20, stats
    assert stats["reserved"] == 0 and stats["connections"] == 0, stats
