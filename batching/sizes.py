"""Preferred batch sizes: the validation shared by the dynamic and sequence policies.

Both policies accept `preferred_batch_sizes` (Triton's name); the rules are one:
each size >= 1, deduplicated and sorted, none above `max_batch_size`.
"""

from __future__ import annotations


def sorted_sizes(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """`preferred_batch_sizes`, checked (each >= 1), deduplicated and sorted."""
    bad = [s for s in sizes if s < 1]
    if bad:
        raise ValueError(f"preferred_batch_sizes={list(sizes)} has {bad}: every size must be >= 1")
    return tuple(sorted(set(sizes)))


def check_preferred_fit(sizes: tuple[int, ...], max_batch_size: int) -> None:
    too_big = [s for s in sizes if s > max_batch_size]
    if too_big:
        raise ValueError(f"preferred_batch_sizes {too_big} exceed max_batch_size={max_batch_size}: "
                         "lower them or raise max_batch_size")
