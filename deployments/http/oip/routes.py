"""The route table: (method, path template) -> handler, matched without building objects.

Like Starlette's `Router` in what it decides (a table read top to bottom, 404 for an
unknown path, 405 with `Allow` for a known path and the wrong method), not in how:
a match is one dict lookup for a fixed path, or a split and a comparison of a few
segments for a templated one (then remembered: the next request to that path is one
lookup too); no Request, no regex per route. A `{param}` segment
takes a name as the config writes them (`[A-Za-z0-9][A-Za-z0-9_.-]*`), so an empty
segment (`/v2/models//infer`), a `..` left by a decoded `%2f`, or anything stranger
is no route at all: 404, in the protocol's error shape.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from deployments.http.oip.errors import MethodNotAllowed, NoRoute
from deployments.protocol.limits import shown

PARAM = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*\Z")
SEEN_PATHS = 4096


@dataclass(frozen=True, slots=True)
class Route:
    """One row of the table: `template` like "/v2/models/{model}/infer"."""

    method: str
    template: str
    handler: Callable[..., Any]


class Router:
    """Matches (method, path) to a route and its path parameters.

    >>> r = Router([Route("GET", "/v2/models/{model}", "meta")])
    >>> route, params = r.match("GET", "/v2/models/mlp")
    >>> route.handler, params
    ('meta', {'model': 'mlp'})
    """

    def __init__(self, routes: Iterable[Route]) -> None:
        self._fixed: dict[str, dict[str, Route]] = {}
        # (segment count, last segment or None for a parameter) -> templates to try
        self._templated: dict[tuple[int, str | None], list[_Template]] = {}
        # templated paths matched before -> (template, parameters): the next is one lookup
        self._seen: dict[str, tuple[_Template, dict[str, str]]] = {}
        for route in routes:
            parts = route.template.split("/")
            if not any(_is_param(p) for p in parts):
                self._fixed.setdefault(route.template, {})[route.method] = route
                continue
            last = None if _is_param(parts[-1]) else parts[-1]
            group = self._templated.setdefault((len(parts), last), [])
            found = next((t for t in group if t.template == route.template), None)
            if found is None:
                found = _Template(route.template, parts)
                group.append(found)
            found.methods[route.method] = route

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route and its parameters; `NoRoute` (404) or `MethodNotAllowed` (405)."""
        methods = self._fixed.get(path)
        if methods is not None:
            return self._pick(methods, method, path, path), {}
        hit = self._seen.get(path)
        if hit is not None:
            template, params = hit
            return self._pick(template.methods, method, path, template.template), params
        parts = path.split("/")
        n = len(parts)
        for key in ((n, parts[-1]), (n, None)):
            for template in self._templated.get(key, ()):
                params = template.bind(parts)
                if params is not None:
                    if len(self._seen) >= SEEN_PATHS:  # bounded: paths are the client's
                        self._seen.clear()
                    self._seen[path] = (template, params)
                    return self._pick(template.methods, method, path, template.template), params
        raise NoRoute(f"no route {method} {shown(path)}: this server speaks the Open "
                      "Inference Protocol under /v2 (GET /v2 describes it, GET "
                      "/v2/models/{model} describes a model) and the OpenAI API under /v1 "
                      "(completions, chat/completions, models)")

    @staticmethod
    def _pick(methods: dict[str, Route], method: str, path: str, template: str) -> Route:
        route = methods.get(method)
        if route is None:
            allow = tuple(sorted(methods))
            raise MethodNotAllowed(f"{method} is not allowed on {shown(path)}; use "
                                   f"{' or '.join(allow)}", allow, template)
        return route


class _Template:
    __slots__ = ("methods", "names", "parts", "template")

    def __init__(self, template: str, parts: list[str]) -> None:
        self.template = template
        self.parts = [None if _is_param(p) else p for p in parts]
        self.names = [p[1:-1] if _is_param(p) else None for p in parts]
        self.methods: dict[str, Route] = {}

    def bind(self, parts: list[str]) -> dict[str, str] | None:
        params = {}
        for want, name, got in zip(self.parts, self.names, parts):
            if want is None:
                if PARAM.match(got) is None:
                    return None
                params[name] = got
            elif want != got:
                return None
        return params


def _is_param(part: str) -> bool:
    return part.startswith("{") and part.endswith("}")
