"""The batching engine without Ray: the embedded host, its baseline, the simulator.

    embedded_vs_seed.py  the embedded `BatchedService` against the seed's design
    seed_design.py       the seed's design, re-implemented as the baseline
    sim_vs_real.py       the simulator against a real run of the same policy
    sweep.py             what each policy does as load grows (the notebooks use it)
"""
