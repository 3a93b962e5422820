"""The replica wing: the model replicas (actors, or threads of the engine's process), the
pool that keeps them and the client an engine calls them through. See `deployments`."""
