"""The notebooks' size switch: small in CI, full by hand, or what RAYBATCH_NOTEBOOK_SCALE says."""

from __future__ import annotations

import pytest

from benchmarks.common.scale import SCALE_ENV, notebook_scale, pick


@pytest.mark.parametrize(("env", "scale"), [
    ({}, "full"),
    ({"CI": "true"}, "small"),
    ({"CI": "1"}, "small"),
    ({"CI": "false"}, "full"),
    ({"CI": ""}, "full"),
    ({"CI": "true", SCALE_ENV: "full"}, "full"),
    ({SCALE_ENV: "small"}, "small"),
    ({SCALE_ENV: " Small "}, "small"),
    ({SCALE_ENV: ""}, "full"),
])
def test_scale_from_the_environment(env, scale):
    assert notebook_scale(env) == scale


def test_an_unknown_scale_names_the_choices():
    with pytest.raises(ValueError, match=r"RAYBATCH_NOTEBOOK_SCALE='huge'.*'small'.*'full'"):
        notebook_scale({SCALE_ENV: "huge"})


def test_pick():
    assert pick("small", small=1, full=2) == 1
    assert pick("full", small=1, full=2) == 2
