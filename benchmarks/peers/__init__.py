"""Raybatch beside the serving systems a user who measures would pick instead.

`python -m benchmarks.peers`: Triton (`tritonserver` from nvidia-pytriton, Python
backend, dynamic batcher), mosec, Ray Serve's `@serve.batch` and LitServe serve the
same mlp under the same wrk load as Raybatch's demo settings, one after another; one
table with req/s, latency, server CPU per request and Raybatch's ratio to each.

    __main__.py  the command: install, lock, run each system, table, results
    install.py   the peers' own venv (.peers/venv) and Triton's server tree
    systems.py   how each system is started, asked, checked, and stopped
    measure.py   /proc CPU accounting, wrk runs, the answer check
    report.py    ratios, targets and the Markdown table
    ray_host.py  the `@serve.batch` peer in a process of its own
    apps/        the peers' servers (run in the peers' venv, no Raybatch imports)
"""
