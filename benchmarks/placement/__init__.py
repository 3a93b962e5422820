"""Where replicas run and how they start: pinning, the replica's pipeline, start-up.

    pinning.py          pinned vs unpinned replicas, with and without a noisy neighbour
    replica_pipeline.py how busy a replica actor stays with read-ahead on and off
    startup.py          `raybatch up` to ready, and the CPU of every process it starts
"""
