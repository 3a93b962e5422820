"""The native front: `_front.c` holds the sockets on a thread of its own and queues the
common infer request; `front.py` and `blocks.py` are its Python side. See `deployments.http`."""
