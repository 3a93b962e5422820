"""The wire: what crosses a hop between processes (the request and answer records and
their bundles, partial cancels, the direct connection, its keepalive, generation streams).
It imports no other wing. See `deployments` for the map."""
