"""Raybatch's own HTTP/1.1 server: connections, framing rules, limits, keep-alive, stop.
See `deployments.http`."""
