"""benchmarks.serve.bundle_path drives the real client route, coalescer, bundle forms and
engine: every answer is checked, in both bundle forms."""

import asyncio

import pytest

from benchmarks.serve import bundle_path


@pytest.mark.parametrize("form", [[], ["--unstacked"]], ids=["stacked", "unstacked"])
def test_every_request_is_answered_with_its_own_shape_in_either_bundle_form(form, capsys):
    args = bundle_path.parse_args(["--requests", "300", "--concurrency", "16",
                                   "--repeats", "1", *form])
    best = asyncio.run(bundle_path.main_async(args))
    assert best > 0
    assert "300 requests, C=16" in capsys.readouterr().out


def test_the_unstacked_form_is_undone_after_the_run():
    from deployments.ingress import coalesce
    from deployments.wire import bundles

    args = bundle_path.parse_args(["--requests", "50", "--concurrency", "4", "--repeats", "1",
                                   "--unstacked"])
    asyncio.run(bundle_path.main_async(args))
    assert coalesce.pack is bundles.pack
