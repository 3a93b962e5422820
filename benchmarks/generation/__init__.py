"""Stateful and generative models: sequence batching, continuous batching.

    continuous.py  continuous vs lockstep vs no batching of a generative model, in process
    over_http.py   the same through Ray Serve and server-sent events
    sequences.py   64 concurrent sequences against running them one at a time
"""
