"""Joining the cluster `raybatch status` (and `status --watch`) asks, and the handle of the
app it asks: with the cluster's token auth, and no cluster there or no app of that name on
it said in a line (`StatusError`), not a traceback. One module both commands import."""

from __future__ import annotations

import argparse
from typing import Any

from cluster.rayauth import connect_here
from raybatch.serving import quiet_token_auth_notice


class StatusError(Exception):
    """`raybatch status` cannot ask: no cluster there, or no such app on it."""


def app_handle(args: argparse.Namespace) -> Any:
    """A handle to the app `args.app` on the cluster at `args.address` (joined with its
    token auth); StatusError when there is no cluster there or no such app on it."""
    import ray
    from ray import serve
    from ray.serve.exceptions import RayServeException

    quiet_token_auth_notice()
    connect_here(args.address, args.auth_token_file)  # the cluster's token auth, if any
    try:
        ray.init(address=args.address, log_to_driver=False)
    except (ConnectionError, ValueError) as e:  # ValueError: an address Ray cannot read
        raise StatusError(f"no Ray cluster to ask ({e}): start one with `raybatch up`, or "
                          "give the running one's --address") from None
    try:
        return serve.get_app_handle(args.app)
    except RayServeException as e:
        raise StatusError(f"{e} (--app names the app; `raybatch up` deploys the config's "
                          "app_name)") from None
