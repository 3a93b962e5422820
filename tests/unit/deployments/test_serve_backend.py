"""`ServeBackend`, the ingress's models as the HTTP app and the native front ask for them:
built from the shipped demo config (no Ray call is made to build it)."""

from __future__ import annotations

from pathlib import Path

from cluster.config import load_config
from deployments.ingress.deployment import ServeBackend

DEMO = Path(__file__).resolve().parents[3] / "deployments" / "configs" / "demo.yaml"


def test_the_front_gathers_for_models_in_batching_actors_only():
    """What the native front asks of each model before it queues its requests itself
    (`deployments.http.native.blocks`): a dynamic model in batching actors gathers for its
    own max_queue_delay_s; one whose engine runs in the ingress, or that is not dynamic,
    does not gather."""
    config = load_config(DEMO)
    backend = ServeBackend(config)
    for m in config.models:
        got = backend.gather_s(backend.model(m.name))
        in_actors = m.batcher.placement == "actor" and m.batching.kind == "dynamic"
        assert got == (m.batching.max_queue_delay_s if in_actors else 0.0), m.name
    assert any(m.batcher.placement == "actor" for m in config.models)  # the case is seen
