"""What every benchmark shares: the load generators, the benchmark models, the notebooks' scale.

    loadgen.py  a closed-loop load generator for anything with an async submit
    wrk.py      a `wrk` driver for HTTP points (little client CPU)
    models.py   the benchmark models (sleep, mlp) and each one's own ceiling
    scale.py    how big the notebooks' experiments are (small in CI, full by hand)
"""
