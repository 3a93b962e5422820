"""Fuzz (fixed seed): a few hundred malformed requests through the app in-process; every
answer a 4xx `{"error": <str>}`, nothing internal in it, and the app serves after."""

from __future__ import annotations

import collections

from tests.conftest import arun as run
from tests.unit.deployments.http.fakes import call, infer_body, make_app
from tests.unit.deployments.http.fuzz_cases import Target, cases, check, every_corruption

TARGET = Target(infer_model="square", generate_model="words", max_body_bytes=65536)
SEED, N = 20_261_123, 400


def test_every_malformed_request_gets_a_4xx_error_and_the_app_lives_on():
    app, _ = make_app(max_body_bytes=TARGET.max_body_bytes)
    kinds: collections.Counter = collections.Counter()

    async def main():
        for case in cases(SEED, N, TARGET):
            r = await call(app, case.method, case.path, case.body, case.headers)
            check(case, r.status, r.headers, r.body)
            kinds[r.status] += 1
        return await call(app, "POST", "/v2/models/square/infer", infer_body([3.0]))

    after = run(main())
    assert after.status == 200 and after.json()["outputs"][0]["data"] == [9.0]
    assert app.inflight == 0 and app.streams == {}
    # the cases reach every kind of refusal, not just the first check
    assert {400, 404, 405, 413, 431} <= set(kinds), kinds
    assert sum(n for (_, status), n in app.response_counts().items() if status >= 500) == 0


def test_the_cases_are_the_same_for_the_same_seed():
    assert cases(7, 50, TARGET) == cases(7, 50, TARGET)
    assert cases(7, 50, TARGET) != cases(8, 50, TARGET)


def test_each_body_corruption_alone_is_refused():
    # the seeded draw above reaches a sample of them; each one, once, here
    app, _ = make_app(max_body_bytes=TARGET.max_body_bytes)
    every = every_corruption(TARGET)

    async def main():
        for case in every:
            r = await call(app, case.method, case.path, case.body, case.headers)
            check(case, r.status, r.headers, r.body)

    run(main())
    assert len(every) > 250 and app.inflight == 0 and app.streams == {}
