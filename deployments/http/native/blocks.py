"""What the native front queued, as engine requests: plans learnt from the Python server,
blocks of requests submitted at once, and their answers handed back in one call.

A plan is what the front may queue itself: a binary request's JSON header (or a JSON
request's body with its data list emptied) that the Python server answered 200, whose
engine request is plain items (one input with a batch dim; no priority, timeout or
sequence). A block is up to the model's max batch size of one plan's requests, one engine
request; its answer is made once (the first request's JSON, as `encode_infer_raw` makes
it) and each request gets its own rows: binary outputs as slices, one JSON output of
floats cut from one orjson call (checked equal to the Python path's answer for each
block's first request, and for the second once a plan); anything else (BYTES, several
JSON outputs, NaN in one request's rows) request by request, each with its own answer or
error. An error of the whole block (admission, the model) is the same answer to each of
its requests. Where a model's engine is in batching actors, its arrivals gather into full
blocks while a batch of it is in flight (`deployments.http.native.gather`). A client that went
away: see `deployments.http.native.departures`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from deployments.http.native import departures
from deployments.http.native.gather import Gather
from deployments.http.oip.errors import Unavailable, error_parts, log_error
from deployments.http.pyserver.cycle import response_head
from deployments.protocol import (
    InferRequest,
    PayloadTooLarge,
    encode_infer_raw,
    parse_infer_request,
)
from deployments.protocol.plans import Plan

_ARRIVAL = np.dtype([("token", "<u8"), ("t", "<f8"), ("plan", "<i4"), ("len", "<u4")])
_PLAIN_PARAMETERS = {"binary_data_output"}  # what a queued request may carry



@dataclass(slots=True)
class _Plan:
    """A request kind the front queues: what makes a block of them an engine request."""

    model: Any  # ModelEntry
    template: str  # the route's template, for the request counts
    path: str
    plan: Any  # deployments.protocol.plans.Plan
    name: str  # the one input
    dtype: np.dtype
    item_shape: tuple[int, ...]  # the input's shape past its batch dim
    rows: int  # its batch dim: items per request
    size: int  # tensor bytes per request
    per_block: int  # requests per block
    pid: int = -1  # its index among the plans
    gather: Gather | None = None  # its model's gathering, where blocks wait to fill
    rows_checked: bool = False  # one JSON output cut from the block's: checked once



class Blocks:
    """The plans of a `FrontServer` (`server`: its `front`, `oip` app, `accepting`) and
    its blocks in flight (`pending`)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.plans: list[_Plan] = []
        self._known: set[tuple[bytes, bytes, bool]] = set()
        self.pending = 0  # blocks the engine has not answered yet
        self.flying: dict[asyncio.Future, list[Any]] = {}  # block -> [tokens, gone, plan]
        self.gathers: dict[str, Gather] = {}  # model -> its gathering (`gather`)
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def learn(self, scope: dict, body: bytes) -> None:
        """The Python server answered this request 200: if the engine takes its kind as
        plain items, the front queues the next ones with the same target and header."""
        if self.server.front is None or self.server.oip is None or scope["query_string"]:
            return
        length = None
        for name, value in scope["headers"]:
            if name == b"inference-header-content-length":
                length = value
        try:
            header = body[:int(length)] if length is not None else None
        except ValueError:
            return
        target = scope["raw_path"]
        size = 0
        if header is None:  # JSON: its key is the body with the data list emptied
            found = self.server.front.skeleton(body)
            if found is None:
                return
            header, count = found
        if (target, header, length is None) in self._known:
            return
        self._known.add((target, header, length is None))  # learnt or refused, once
        if length is None:
            plan = self._json_plan(scope, body, count)
            size = 0 if plan is None else plan.dtype.itemsize
        else:
            plan = self._plan(scope, header)
        front = self.server.front
        if plan is not None and front.add_plan(target, header, plan.size, len(self.plans), size):
            plan.pid = len(self.plans)
            self.plans.append(plan)

    def _model(self, scope: dict) -> tuple[Any, Any] | None:
        app = self.server.oip
        path = scope["path"]
        root = scope.get("root_path") or ""
        try:
            route, params = app.router.match("POST", path[len(root):] if root and
                                             path.startswith(root) else path)
            return route, app.backend.model(params["model"], params.get("version"))
        except Exception:
            return None

    def _json_plan(self, scope: dict, body: bytes, count: int) -> _Plan | None:
        """The plan of a JSON request answered 200, from the Python parser's reading of it:
        one float input (FP32 or FP64, which the front reads as the Python path does) of
        `count` numbers in its one data list."""
        found = self._model(scope)
        if found is None:
            return None
        route, model = found
        try:
            request = parse_infer_request(body, {}, model.spec, self.server.oip.request_limits)
        except Exception:
            return None
        if len(request.inputs) != 1 or not request.batch_size:
            return None
        (name, array), = request.inputs.items()
        if array.dtype.kind != "f" or array.dtype.itemsize not in (4, 8) or (
                array.size != count or array.shape[0] != request.batch_size):
            return None
        plan = Plan(self.server.oip.request_limits, array.nbytes,
                    ((name, array.dtype, array.shape, 0, array.size),), request.id,
                    dict(request.parameters), list(request.outputs_requested),
                    request.batch_size)
        return self._checked(route, model, plan)

    def _plan(self, scope: dict, header: bytes) -> _Plan | None:
        found = self._model(scope)
        if found is None:
            return None
        route, model = found
        return self._checked(route, model, model.spec.plans.get(header))

    def _checked(self, route: Any, model: Any, plan: Plan | None) -> _Plan | None:
        if (plan is None or len(plan.inputs) != 1 or not plan.batch_size
                or not set(plan.parameters) <= _PLAIN_PARAMETERS):
            return None
        name, dtype, shape, start, count = plan.inputs[0]
        if start != 0 or count * dtype.itemsize != plan.binary_size or shape[0] != plan.batch_size:
            return None
        most = model.spec.max_batch_size or plan.batch_size
        path = route.template.replace("{model}", model.name)
        gather = self.gathers.get(model.name)
        if gather is None:
            hold = getattr(self.server.oip.backend, "gather_s", None)
            delay_s = hold(model) if hold is not None else 0.0
            if delay_s > 0:
                gather = self.gathers[model.name] = Gather(most, delay_s)
        return _Plan(model, route.template, path, plan, name, dtype, tuple(shape[1:]),
                     plan.batch_size, plan.binary_size, max(1, most // plan.batch_size),
                     gather=gather)

    # -- queued requests, in blocks ---------------------------------------------------------
    def queued(self, arrivals: bytes, payloads: bytes) -> None:
        """What `take` returned: arrival records (`_ARRIVAL`) and their tensors' bytes.
        Whatever fails on the way to the engine is each request's 500, never silence."""
        rec = np.frombuffer(arrivals, _ARRIVAL)
        data = memoryview(payloads)
        ids = rec["plan"]
        if (ids == ids[0]).all():
            groups = [(ids[0], rec, data)]
        else:
            ends = np.cumsum(rec["len"], dtype=np.int64)
            groups = []
            for pid in np.unique(ids):
                idx = np.flatnonzero(ids == pid)
                joined = b"".join(data[ends[i] - rec["len"][i]:ends[i]] for i in idx)
                groups.append((pid, rec[idx], memoryview(joined)))
        for pid, part, payload in groups:
            plan = self.plans[pid]
            try:
                if plan.gather is not None:
                    self._gathered(plan, part, payload)
                else:
                    self._blocks(plan, part, payload)
            except Exception as exc:  # a bug here: those requests still get an answer
                self._fail(plan, part["token"].tobytes(), len(part), exc)

    # -- gathering (deployments.http.native.gather) ------------------------------------------------
    def _gathered(self, plan: _Plan, rec: np.ndarray, data: memoryview) -> None:
        """`plan`'s arrivals, through its model's gathering: held while it holds, until a
        block is full; else sent with what waited before them."""
        g = plan.gather
        assert g is not None
        if not g.holds() or self.server.oip.draining or not self.server.accepting:
            if g.counts.get(plan.pid):
                self._release(plan, [*g.take(plan.pid)[0][1], (rec, data)])
            else:
                self._blocks(plan, rec, data)
            return
        fresh = not g.counts
        if g.hold(plan.pid, (rec, data), len(rec), time.monotonic()) >= plan.per_block:
            self._release(plan, g.take(plan.pid)[0][1], whole=True)
        if fresh and g.counts:
            self._timers[plan.model.name] = asyncio.get_running_loop().call_at(
                g.due_s, self._due, plan.model.name)

    def _release(self, plan: _Plan, parts: list, whole: bool = False) -> None:
        """Send `parts` of `plan` as blocks (`whole`: full blocks only, the rest waits on)."""
        rec = np.concatenate([r for r, _ in parts]) if len(parts) > 1 else parts[0][0]
        data = memoryview(b"".join(d for _, d in parts)) if len(parts) > 1 else parts[0][1]
        n = len(rec)
        if whole and n % plan.per_block:
            cut = n - n % plan.per_block
            assert plan.gather is not None
            plan.gather.hold(plan.pid, (rec[cut:], data[cut * plan.size:]), n - cut,
                             time.monotonic())
            rec, data = rec[:cut], data[:cut * plan.size]
        try:
            self._blocks(plan, rec, data)
        except Exception as exc:  # a bug here: those requests still get an answer
            self._fail(plan, rec["token"].tobytes(), len(rec), exc)

    def release(self, model: str | None = None) -> None:
        """Send whatever waits (of `model`, or of every model) now."""
        for name, g in self.gathers.items() if model is None else [(model, self.gathers[model])]:
            timer = self._timers.pop(name, None)
            if timer is not None:
                timer.cancel()
            for pid, parts in g.take():
                self._release(self.plans[pid], parts)

    def _due(self, model: str) -> None:
        self._timers.pop(model, None)
        g = self.gathers[model]
        if g.counts:
            if time.monotonic() >= g.due_s - 1e-4:
                self.release(model)
            else:
                self._timers[model] = asyncio.get_running_loop().call_at(
                    g.due_s, self._due, model)

    def _blocks(self, plan: _Plan, rec: np.ndarray, data: memoryview) -> None:
        step, size = plan.per_block, plan.size
        for i in range(0, len(rec), step):
            self._block(plan, rec[i:i + step], data[i * size:(i + step) * size])

    def _block(self, plan: _Plan, rec: np.ndarray, data: memoryview) -> None:
        app = self.server.oip
        k = len(rec)
        room = 0 if app.draining else app.max_inflight - app.inflight
        if room < k:  # as the Python server: those past the limit get 503 and a close
            why = ("this replica is shutting down; retry, another replica will answer"
                   if app.draining else f"this replica serves {app.inflight} requests, its "
                   "limit (ingress.max_inflight_requests); retry shortly")
            if app.draining:  # from now on the Python server answers (and refuses) all
                self.server.front.set(False, self.server.accepting)
            if room > 0:
                self._block(plan, rec[:room], data[:room * plan.size])
            self._fail(plan, rec[max(room, 0):]["token"].tobytes(), k - max(room, 0),
                       Unavailable(why), close=True)
            return
        tokens = rec["token"].tobytes()
        p = plan.plan
        try:
            array = np.frombuffer(data, plan.dtype).reshape((k * plan.rows, *plan.item_shape))
            request = InferRequest(p.request_id, {plan.name: array}, dict(p.parameters),
                                   list(p.outputs), k * plan.rows)
            future, outputs = app._submit(plan.model, request, float(rec["t"].min()), k)
        except PayloadTooLarge as exc:
            if k == 1:
                self._fail(plan, tokens, k, exc)
                return
            # the model takes fewer items a request than a batch (limits.max_request_items):
            # this plan's blocks halve until they fit
            plan.per_block = max(1, min(plan.per_block, k) // 2)
            i = 0
            while i < k:
                step = plan.per_block  # smaller still if a part is refused again
                self._block(plan, rec[i:i + step], data[i * plan.size:(i + step) * plan.size])
                i += step
            return
        except Exception as exc:
            self._fail(plan, tokens, k, exc)
            return
        app.inflight += k
        self.pending += 1
        self.flying[future] = [rec["token"], None, plan]  # gone: a mask, once any is
        if plan.gather is not None:
            plan.gather.sent(k * plan.rows)
        future.add_done_callback(
            lambda f: self._answered(plan, request, tokens, k, outputs, f))

    def _answered(self, plan: _Plan, request: InferRequest, tokens: bytes, k: int,
                  outputs: Any, future: asyncio.Future) -> None:
        app = self.server.oip
        self.pending -= 1
        app.inflight -= k
        flight = self.flying.pop(future, None)
        if app.inflight == 0 and app._idle is not None:
            app._idle.set()
        g = plan.gather
        if g is not None:
            g.answered(k * plan.rows)
            if g.counts and not g.holds():
                self.release(plan.model.name)
        left = None if flight is None or flight[1] is None else ~flight[1]
        if left is not None:  # clients of it went away (`departures`): 499, nothing written
            self._drop(plan, flight[0][~left].tobytes(), k - int(left.sum()))
            tokens, k = flight[0][left].tobytes(), int(left.sum())
            if not k:
                return
        try:
            if future.cancelled():
                raise asyncio.CancelledError("the engine dropped the block")
            self._answer(plan, request, tokens, k, departures.outputs_of(
                future.result(), outputs, left, k, plan.rows))
        except Exception as exc:
            self._fail(plan, tokens, k, exc)

    def _answer(self, plan: _Plan, request: InferRequest, tokens: bytes, k: int,
                outs: dict[str, np.ndarray]) -> None:
        model, rows = plan.model, plan.rows
        first = {name: a[:rows] for name, a in outs.items()}
        try:
            parts, headers = encode_infer_raw(model.name, model.version, request.id, first,
                                              request.outputs_requested,
                                              request.binary_data_output)
        except Exception:  # the first request's rows cannot be answered: each its own
            self._one_by_one(plan, request, tokens, k, outs)
            return
        slices = []
        selected = request.outputs_requested or [(n, request.binary_data_output) for n in outs]
        for name, binary in selected:
            if binary:
                whole = np.ascontiguousarray(outs[name])
                per = whole.nbytes // k if whole.dtype != object else -1
                if per < 0 or whole.nbytes != per * k or len(whole) != k * rows:
                    break
                slices.append((whole, per))
        if slices and len(slices) == len(selected) == len(parts) - 1 and all(
                memoryview(part).nbytes == per for part, (_, per) in zip(parts[1:], slices)):
            head = response_head(200, headers, sum(memoryview(p).nbytes for p in parts))
            self.server.front.answer_parts(tokens, head, bytes(parts[0]),
                                    [(memoryview(w).cast("B"), per) for w, per in slices])
        elif not (len(parts) == 1 and len(selected) == 1 and self._json_rows(
                plan, request, tokens, k, outs, selected[0][0], bytes(parts[0]), headers)):
            self._one_by_one(plan, request, tokens, k, outs)
            return
        self._counted(plan, 200, k)

    def _json_rows(self, plan: _Plan, request: InferRequest, tokens: bytes, k: int,
                   outs: dict[str, np.ndarray], name: str, first: bytes, headers: list) -> bool:
        """One JSON output of floats: the block's rows written by orjson at once and cut
        per request: each block's first answer checked equal to the Python path's, and
        the second once a plan."""
        whole = outs[name]
        if (type(whole) is not np.ndarray or whole.dtype.kind != "f" or len(whole) != k * plan.rows
                or not np.isfinite(whole).all()):
            return False
        text = orjson.dumps(np.ascontiguousarray(whole).reshape(k, -1),
                            option=orjson.OPT_SERIALIZE_NUMPY)
        pieces = text[2:-2].split(b"],[")
        if len(pieces) != k:
            return False
        at = first.find(b'"data":[' + pieces[0] + b"]")
        if at < 0:
            return False
        prefix, suffix = first[:at + 8], first[at + 8 + len(pieces[0]):]
        if prefix + pieces[0] + suffix != first:
            return False
        if k > 1 and not plan.rows_checked:  # the second request's answer, the Python
            # path's way, must match (once a plan: the cut does not depend on the values)
            rows = plan.rows
            parts, _ = encode_infer_raw(plan.model.name, plan.model.version, request.id,
                                        {n: a[rows:2 * rows] for n, a in outs.items()},
                                        request.outputs_requested, request.binary_data_output)
            if bytes(parts[0]) != prefix + pieces[1] + suffix:
                return False
            plan.rows_checked = True
        ends = np.cumsum([len(p) for p in pieces], dtype=np.int64)
        head = response_head(200, headers, None)  # the front adds each one's length
        self.server.front.answer_json(tokens, head, prefix, b"".join(pieces), ends.tobytes(),
                                      suffix)
        return True

    def _one_by_one(self, plan: _Plan, request: InferRequest, tokens: bytes, k: int,
                    outs: dict[str, np.ndarray]) -> None:
        """Outputs whose answer is not the same JSON around each request's rows (BYTES,
        several JSON outputs, NaN in one request's rows): each request's answer (or
        error) made as the Python path makes it."""
        model, rows = plan.model, plan.rows
        each = np.frombuffer(tokens, np.uint64)
        for i in range(k):
            one = {name: a[i * rows:(i + 1) * rows] for name, a in outs.items()}
            token = each[i:i + 1].tobytes()
            try:
                parts, headers = encode_infer_raw(model.name, model.version, request.id, one,
                                                  request.outputs_requested,
                                                  request.binary_data_output)
            except Exception as exc:
                self._fail(plan, token, 1, exc)
                continue
            body = b"".join(parts)
            self.server.front.answer_same(token, response_head(200, headers, len(body)), body)
            self._counted(plan, 200, 1)

    # -- clients that went away --------------------------------------------------------------
    def gone(self, prefix: int) -> None:
        """A client went away with requests queued (`prefix`: its tokens >> 24): those
        gathering are dropped, its rows of blocks withdrawn (`departures`)."""
        departures.gone(self, prefix)

    def _drop(self, plan: _Plan, tokens: bytes, k: int) -> None:
        """Requests whose clients went away: counted in by the front (their slots wait for
        them), nothing written; 499, as the Python path counts them."""
        self.server.front.answer_same(tokens, b"", b"")
        self._counted(plan, 499, k)

    def _fail(self, plan: _Plan, tokens: bytes, k: int, exc: Exception,
              close: bool = False) -> None:
        """Each request of the block gets the error the Python path gives (`close`: and
        the connection closes after it, as the Python server's refusals do)."""
        status, body, headers = error_parts(exc)
        log_error(exc, status, "POST", plan.path)
        head = response_head(status, headers, len(body))
        self.server.front.answer_same(tokens, head, body, close)
        self._counted(plan, status, k)

    def _counted(self, plan: _Plan, status: int, k: int) -> None:
        counts = self.server.oip.counts
        key = (plan.template, status)
        counts[key] = counts.get(key, 0) + k
