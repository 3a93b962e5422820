"""The configuration reference, generated from the config models themselves.

Every field of the YAML config is documented once, by the docstring under it in its
pydantic model (`cluster/config.py`, `appsettings.py`, `replicas.py`, `tensorspec.py`,
`k8s/settings.py`, the batching policies). This module walks `RaybatchConfig` and
writes those docstrings as Markdown tables, so the documentation site's configuration
page cannot drift from the code: the docs build (`docs/hooks.py`) calls
`render_reference()`, and `python -m cluster.docgen` prints it.

Attribute docstrings are read from the source with `ast` (pydantic only keeps them with
`use_attribute_docstrings`, which would change every model's `description`).
"""

from __future__ import annotations

import ast
import enum
import inspect
import itertools
import textwrap
import types
import typing
from functools import cache

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from batching.dynamic.policy import DynamicPolicy
from batching.iterative.policy import IterativePolicy
from batching.sequence.policy import SequencePolicy
from cluster.config import RaybatchConfig

# Where each section sits in a config file; the batching kinds share `models[].batching`.
SECTIONS: tuple[tuple[str, type[BaseModel], str], ...] = (
    ("", RaybatchConfig, "The top level of the file."),
    ("models[].batching (kind: dynamic)", DynamicPolicy, "Stateless models (the default)."),
    ("models[].batching (kind: sequence)", SequencePolicy, "Stateful models."),
    ("models[].batching (kind: iterative)", IterativePolicy, "Generative models."),
)


@cache
def _attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it, for `cls` and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not issubclass(klass, BaseModel) or klass is BaseModel:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, nxt in itertools.pairwise(body):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models a field's type holds (in a tuple, an Optional, a union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += _models_in(arg)
    return out


def _type_name(annotation: object) -> str:
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return " | ".join(repr(m.value) for m in annotation)
        return "None" if annotation is type(None) else annotation.__name__
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{name}[{inner}]"
    return str(annotation).replace("typing.", "")


def _default(field) -> str:
    if field.is_required():
        return "required"
    value = field.default
    if value is PydanticUndefined and field.default_factory is not None:
        value = field.default_factory()
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value!r}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _walk(path: str, cls: type[BaseModel], seen: set[type]) -> list[tuple]:
    """(path, model) for `cls` and every model nested under it, depth first; a model
    found twice (inputs and outputs are both tensors) is documented where first found."""
    if cls in seen:
        return []
    seen.add(cls)
    out = [(path, cls)]
    for name, field in cls.model_fields.items():
        if cls is not DynamicPolicy and name == "batching":
            continue  # the kinds are sections of their own
        suffix = "[]" if typing.get_origin(field.annotation) is tuple else ""
        for sub in _models_in(field.annotation):
            if sub in (DynamicPolicy, SequencePolicy, IterativePolicy):
                continue
            out += _walk(f"{path}.{name}{suffix}".lstrip("."), sub, seen)
    return out


def sections() -> list[tuple[str, type[BaseModel], str]]:
    """Every documented block: (where it sits in the file, its model, a note)."""
    out, seen = [], set()
    for path, cls, note in SECTIONS:
        for sub_path, sub in _walk(path.split(" ")[0], cls, seen):
            title = path if sub is cls else sub_path
            out.append((title, sub, note if sub is cls else ""))
    return out


def field_paths() -> set[str]:
    """Every field of the config, as `section.field` (what the reference must list)."""
    return {f"{title}.{name}".lstrip(".") for title, cls, _ in sections()
            for name in cls.model_fields}


def render_reference() -> str:
    """The Markdown of the configuration reference: one table per block."""
    lines: list[str] = []
    for title, cls, note in sections():
        lines += [f"### `{title or 'top level'}`", ""]
        doc = inspect.getdoc(cls) or ""
        if doc and doc != inspect.getdoc(BaseModel):
            lines += [" ".join(doc.split("\n\n")[0].split()), ""]
        if note:
            lines += [note, ""]
        docs = _attribute_docs(cls)
        lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
        for name, field in cls.model_fields.items():
            meaning = docs.get(name) or (field.description or "")
            # a pipe inside a code span does not split a cell (Python-Markdown's tables)
            kind = " ".join(_type_name(field.annotation).split())
            lines.append(f"| `{name}` | `{kind}` | "
                         f"{_cell(_default(field))} | {_cell(meaning)} |")
        lines.append("")
    return "\n".join(lines)


def undocumented() -> list[str]:
    """Fields with no docstring (a unit test keeps this list from growing)."""
    return sorted(f"{cls.__name__}.{name}" for _, cls, _ in sections()
                  for name in cls.model_fields
                  if not (_attribute_docs(cls).get(name) or cls.model_fields[name].description))


if __name__ == "__main__":
    print(render_reference())
