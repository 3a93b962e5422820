"""Finding a user's model class: where its module lives, importing it, and whether it fits.

A config names each model's class by import path (`my_models:Ranker`). That module
must be importable in every process that loads the model (the CLI that checks the
config, the batching actor, the replicas): the config's `python_path` folders are put
on `sys.path` in each of them, carried to Ray processes in `RAYBATCH_PYTHON_PATH`.

`import_object` says what to fix when the path is wrong (no such module: which
folders were searched; no such name: which classes the module has), and
`check_transformer` says when the class cannot serve the model's batching kind
(a `VectorTransformer` for dynamic batching, a `StatefulTransformer` for
sequences, a `StepModel` for generation). Both run before anything is deployed.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Iterable
from typing import Any

PYTHON_PATH_ENV = "RAYBATCH_PYTHON_PATH"

# What a class must have to serve each batching kind, and the base class to name.
_KIND_METHODS = {
    "dynamic": (("transform",), "batching.VectorTransformer"),
    "sequence": (("transform", "initial_state"), "batching.StatefulTransformer"),
    "iterative": (("prefill", "step", "encode", "decode"), "batching.StepModel"),
}


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message says where and how to fix it."""


def extend_sys_path(paths: Iterable[str] = ()) -> None:
    """Put `paths` and those in $RAYBATCH_PYTHON_PATH at the front of sys.path, once each."""
    env = [p for p in os.environ.get(PYTHON_PATH_ENV, "").split(os.pathsep) if p]
    for p in [*paths, *env]:
        if p not in sys.path:
            sys.path.insert(0, p)


def python_path_env(paths: Iterable[str]) -> dict[str, str]:
    """The env var that carries `paths` to Ray processes ({} when there are none)."""
    joined = os.pathsep.join(paths)
    return {PYTHON_PATH_ENV: joined} if joined else {}


def import_object(path: str) -> Any:
    """The object named by 'package.module:Name'; ConfigError saying what to fix."""
    extend_sys_path()
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and not module_name.startswith(e.name):
            raise ConfigError(f"cannot import {path!r}: importing {module_name} needs module "
                              f"{e.name!r}, which is not installed ({e})") from e
        raise ConfigError(
            f"cannot import {path!r}: no module named {module_name!r} in {_shown_path()}. "
            "Start raybatch in the folder that holds it, or list that folder in the "
            "config's python_path") from e
    except Exception as e:  # the module itself raised while importing
        raise ConfigError(f"cannot import {path!r}: importing {module_name} raised "
                          f"{type(e).__name__}: {e}") from e
    try:
        return getattr(module, name)
    except AttributeError:
        classes = sorted(n for n, v in vars(module).items()
                         if inspect.isclass(v) and v.__module__ == module.__name__)
        raise ConfigError(f"cannot import {path!r}: module {module_name} has no {name!r}; "
                          f"its classes are {classes}") from None


def _shown_path(limit: int = 4) -> str:
    """The folders a user's module could be in (not the installed packages)."""
    prefixes = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    dirs = [p for p in sys.path if p and os.path.isdir(p)
            and not any(os.path.realpath(p).startswith(pre) for pre in prefixes)]
    return ", ".join(dirs[:limit]) or "no folder of yours"


def check_transformer(path: str, kind: str, where: str = "transformer") -> Any:
    """Import `path` and check that it can serve a model of batching `kind`; the class."""
    target = import_object(path)
    methods, base = _KIND_METHODS[kind]
    if not (inspect.isclass(target) or callable(target) or hasattr(target, methods[0])):
        raise ConfigError(f"{where}={path!r} is a {type(target).__name__}, not a model "
                          f"class: name a subclass of {base}")
    if inspect.isclass(target):
        missing = [m for m in methods if not callable(getattr(target, m, None))]
        if missing:
            raise ConfigError(
                f"{where}={path!r}: class {target.__name__} has no {', '.join(missing)}, "
                f"so it cannot serve a {kind} model; subclass {base} and implement "
                f"{', '.join(methods)}")
    return target


def check_models(config: Any) -> None:
    """Check every model class of a RaybatchConfig before anything is deployed: its module
    imports (with the config's python_path, and the current folder, which a local Ray puts
    on its workers' path too) and its class fits its batching kind."""
    extend_sys_path([*config.python_path, os.getcwd()])
    for i, m in enumerate(config.models):
        check_transformer(m.transformer, m.batching.kind,
                          where=f"models[{i}] ({m.name}): transformer")
