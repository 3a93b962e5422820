"""The batching actor's wing: the actor that hosts a model's engine, the host it gets
and its side of draining. See `deployments` for the map."""
