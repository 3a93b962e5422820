"""The offline validators can fail: what the API server and Serve would reject, they reject."""

from __future__ import annotations

import copy

from ray.serve.schema import ServeDeploySchema

from tests.unit.cluster.k8s.schemas import (
    RAYSERVICE_CRD,
    crd_errors,
    label_errors,
    load_crd,
    strict,
    unknown_keys,
)

MINIMAL = {
    "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "svc"},
    "spec": {"rayClusterConfig": {
        "headGroupSpec": {"template": {"spec": {"containers": [
            {"name": "ray-head", "image": "x", "ports": [{"containerPort": 1}]}]}}},
        "workerGroupSpecs": [{"groupName": "cpu", "template": {"spec": {"containers": [
            {"name": "ray-worker", "image": "x"}]}}}],
    }},
}


def test_a_minimal_rayservice_passes_because_required_fields_have_defaults():
    # workerGroupSpecs[].minReplicas/maxReplicas are required but defaulted (0, 2^31-1)
    assert crd_errors(MINIMAL, load_crd(RAYSERVICE_CRD)) == []


def test_unknown_fields_wrong_types_and_missing_required_ones_are_errors():
    crd = load_crd(RAYSERVICE_CRD)
    bad = copy.deepcopy(MINIMAL)
    head = bad["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    head["containers"][0]["securityContexts"] = {}  # a typo
    bad["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["rayStartParams"] = {"num-cpus": 4}
    del bad["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["groupName"]
    bad["metadata"]["labels"] = {"raybatch.io/x y": "1"}
    errors = "\n".join(crd_errors(bad, crd))
    assert "'securityContexts' was unexpected" in errors
    assert "rayStartParams.num-cpus: 4 is not of type 'string'" in errors
    assert "'groupName' is a required property" in errors
    assert "invalid key 'raybatch.io/x y'" in errors
    assert crd_errors({**MINIMAL, "apiVersion": "ray.io/v2"}, crd)  # not served


def test_nulls_are_pruned_and_preserve_unknown_fields_allows_any():
    crd = load_crd(RAYSERVICE_CRD)
    assert crd_errors({**MINIMAL, "status": None}, crd) == []
    schema = strict({"type": "object", "properties": {
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "closed": {"type": "object", "properties": {"a": {"type": "string"}}}}})
    assert schema["properties"]["closed"]["additionalProperties"] is False
    assert "additionalProperties" not in schema["properties"]["free"]


def test_label_syntax():
    assert label_errors({"raybatch.io/cores": "4", "app": ""}) == []
    assert len(label_errors({"-bad": "x", "ok": "not ok", "a/b/c": "1"})) == 3


def test_unknown_serve_keys_are_found_where_serve_ignores_them():
    config = {"http_options": {"host": "0.0.0.0", "prot": 8000},
              "applications": [{"name": "a", "import_path": "m:app", "route_prefx": "/",
                                "args": {"anything": {"goes": 1}}}]}
    ServeDeploySchema.model_validate(config)  # Serve itself says nothing
    assert unknown_keys(config, ServeDeploySchema) == ["http_options.prot",
                                                        "applications[0].route_prefx"]
