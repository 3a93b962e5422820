"""The wire: what crosses a hop between processes (the request record and its bundles, the
direct connection, its keepalive, generation streams). It imports no
other wing. See `deployments` for the map."""
