"""The Open Inference Protocol as a raw ASGI app: what any of the servers runs (Serve's
proxy, Raybatch's Python server, the native front's Python side). See `deployments.http`."""
