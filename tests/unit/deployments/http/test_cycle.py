"""One request's ASGI `receive` (`deployments.http.pyserver.cycle.Cycle`): every byte of a body
reaches the app, in order, and the last piece is the one that says so.

The connection may parse the rest of a body while `receive` hands over what it holds
(reading again parses what waited in its buffer): the rest must come in the next message,
not be dropped behind a `more_body: False` (a chunked body arriving in pieces under load was
answered 400 "not valid JSON" from its first pieces)."""

from __future__ import annotations

import asyncio

from deployments.http.pyserver.cycle import Cycle


class _Conn:
    """A connection whose reading again parses `rest`: the body's last piece, and its end."""

    def __init__(self, rest: list[bytes]) -> None:
        self.rest = rest
        self.loop = asyncio.get_event_loop_policy().get_event_loop()
        self.closed = False
        self.cycle: Cycle | None = None

    def resume_reading(self) -> None:
        if self.rest:
            self.cycle.body.append(self.rest.pop(0))
            if not self.rest:
                self.cycle.complete = True


def _messages(first: list[bytes], rest: list[bytes]) -> list[dict]:
    async def main() -> list[dict]:
        conn = _Conn(list(rest))
        conn.loop = asyncio.get_running_loop()
        cycle = conn.cycle = Cycle(conn, {}, True)
        cycle.body.extend(first)
        got = []
        while True:
            message = await asyncio.wait_for(cycle.receive(), 5)
            got.append(message)
            if not message["more_body"]:
                return got
    return asyncio.run(main())


def test_the_rest_parsed_while_receiving_comes_in_the_next_message():
    got = _messages([b'{"inputs":', b'[1,'], [b"2]}"])
    assert b"".join(m["body"] for m in got) == b'{"inputs":[1,2]}'
    assert [m["more_body"] for m in got] == [True, False]


def test_pieces_parsed_one_per_receive_all_arrive():
    got = _messages([b"a"], [b"b", b"c", b"d"])
    assert b"".join(m["body"] for m in got) == b"abcd"
    assert got[-1]["more_body"] is False and all(m["more_body"] for m in got[:-1])


def test_a_body_parsed_by_reading_again_while_none_is_held_is_not_waited_for():
    """Nothing held when the app asks; reading again parses what waited (a chunk whose
    size line came in an earlier piece): it is returned, not waited for (a wake that came
    before the wait was lost, and the body timed out 408)."""
    got = _messages([], [b'{"inputs":[1]}'])
    assert b"".join(m["body"] for m in got) == b'{"inputs":[1]}'
