"""Validate rendered objects the way their consumers do, offline.

- `crd_errors(obj, crd)`: a custom resource against its CRD's `openAPIV3Schema` as the
  API server takes it: nulls pruned, defaults applied (so a required field with a
  default may be left out), then the schema with unknown fields rejected everywhere
  except under `x-kubernetes-preserve-unknown-fields` (`kubectl --validate=strict`),
  and `metadata` checked as ObjectMeta (names, label syntax). CEL rules are not
  covered (KubeRay's are only immutability rules).
- `label_errors(labels)`: Kubernetes label syntax (keys and values).
- `unknown_keys(data, model)`: keys of a dict that a pydantic model has no field
  for, recursing into nested models (Ray Serve's schemas ignore unknown keys, so a
  typo would pass `model_validate` silently).
"""

from __future__ import annotations

import copy
import gzip
import re
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft7Validator
from pydantic import BaseModel

DATA = Path(__file__).resolve().parents[3] / "data"
RAYSERVICE_CRD = DATA / "kuberay" / "ray.io_rayservices.yaml.gz"
RAYCLUSTER_CRD = DATA / "kuberay" / "ray.io_rayclusters.yaml.gz"
PODMONITOR_CRD = DATA / "prometheus" / "monitoring.coreos.com_podmonitors.yaml"

_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
OBJECT_META = {"name", "namespace", "labels", "annotations", "generateName"}


@cache
def load_crd(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def version_schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return entry["schema"]["openAPIV3Schema"]


def prune_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [prune_nulls(v) for v in value]
    return value


def apply_defaults(value: Any, schema: dict[str, Any]) -> None:
    """Fill in `default`s of absent properties, in place, as the API server does."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name, sub in props.items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
        extra = schema.get("additionalProperties")
        for name, item in value.items():
            if name in props:
                apply_defaults(item, props[name])
            elif isinstance(extra, dict):
                apply_defaults(item, extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(item, schema["items"])


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON Schema that rejects unknown fields where the API server would."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key in ("description", "nullable", "default"):
            continue
        if key == "properties":
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = strict(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [strict(sub) for sub in value]
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string") and "anyOf" not in schema:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("x-kubernetes-embedded-resource"):
        out.setdefault("properties", {}).update(
            {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
             "metadata": {"type": "object"}})
    preserve = schema.get("x-kubernetes-preserve-unknown-fields")
    if schema.get("type") == "object" and not preserve and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def label_errors(labels: dict[str, Any], where: str = "labels") -> list[str]:
    errors = []
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (not name or len(name) > 63 or not _LABEL_NAME.match(name)
                or (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)))):
            errors.append(f"{where}: invalid key {key!r}")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_NAME.match(value):
            errors.append(f"{where}: invalid value {value!r} of {key!r}")
    return errors


def metadata_errors(meta: dict[str, Any]) -> list[str]:
    errors = [f"metadata.{k}: not an ObjectMeta field" for k in meta if k not in OBJECT_META]
    name = meta.get("name", "")
    if not name or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        errors.append(f"metadata.name={name!r}: not a DNS subdomain")
    if "namespace" in meta and not _DNS_LABEL.match(meta["namespace"]):
        errors.append(f"metadata.namespace={meta['namespace']!r}: not a DNS label")
    errors += label_errors(meta.get("labels", {}), "metadata.labels")
    if not all(isinstance(v, str) for v in meta.get("annotations", {}).values()):
        errors.append("metadata.annotations: values must be strings")
    return errors


def crd_errors(obj: dict[str, Any], crd: dict[str, Any]) -> list[str]:
    """Every way `obj` fails its CRD, as the API server would report it; [] if none."""
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    api_group, _, version = obj.get("apiVersion", "").rpartition("/")
    if api_group != group or obj.get("kind") != kind:
        return [f"apiVersion/kind {obj.get('apiVersion')}/{obj.get('kind')} is not "
                f"{group}/*/{kind}"]
    served = [v["name"] for v in crd["spec"]["versions"] if v.get("served")]
    if version not in served:
        return [f"version {version} is not served (served: {served})"]
    schema = version_schema(crd, version)
    value = prune_nulls(copy.deepcopy(obj))
    apply_defaults(value, schema)
    body = {k: v for k, v in value.items() if k != "metadata"}
    root = strict({**schema, "properties": {k: v for k, v in schema["properties"].items()
                                            if k != "metadata"}})
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
              for e in Draft7Validator(root).iter_errors(body)]
    return errors + metadata_errors(value.get("metadata", {}))


def unknown_keys(data: Any, model: type[BaseModel], where: str = "") -> list[str]:
    """Dotted paths of keys in `data` that `model` (recursively) has no field for."""
    if not isinstance(data, dict):
        return []
    fields = model.model_fields
    names = {f.alias or n: n for n, f in fields.items()} | {n: n for n in fields}
    out = []
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            out.append(path)
            continue
        for sub in _models_in(fields[names[key]].annotation):
            items = value if isinstance(value, list) else [value]
            for i, item in enumerate(items):
                out += unknown_keys(item, sub, f"{path}[{i}]" if isinstance(value, list)
                                    else path)
    return out


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside a field's type (Optional, List, Union, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, tuple,
                                         typing.List, typing.Tuple):  # noqa: UP006
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []
