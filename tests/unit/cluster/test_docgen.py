"""The generated configuration reference lists every field of the config, with what it
means, so the documentation cannot fall behind the code."""

from __future__ import annotations

import typing

from pydantic import BaseModel

from cluster.config import RaybatchConfig
from cluster.docgen import field_paths, render_reference, sections, undocumented


def _all_models(cls: type[BaseModel], out: set[type[BaseModel]]) -> set[type[BaseModel]]:
    if cls in out:
        return out
    out.add(cls)
    for field in cls.model_fields.values():
        stack = [field.annotation]
        while stack:
            t = stack.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                _all_models(t, out)
            stack += typing.get_args(t)
    return out


def test_every_config_model_has_a_section():
    documented = {cls for _, cls, _ in sections()}
    assert _all_models(RaybatchConfig, set()) <= documented


def test_every_field_is_listed_in_the_page():
    page = render_reference()
    for _, cls, _ in sections():
        for name in cls.model_fields:
            assert f"| `{name}` |" in page, f"{cls.__name__}.{name} missing from the reference"
    assert "ingress.native_port" in field_paths()
    assert "models[].replicas.in_process" in field_paths()


def test_every_field_has_a_docstring():
    assert undocumented() == [], "write a docstring under each of these fields"
