"""The fake machines of the placement tests, for the command line's topology views."""

from tests.unit.cluster.conftest import container, four_gpu, no_numa, two_socket

__all__ = ["container", "four_gpu", "no_numa", "two_socket"]
