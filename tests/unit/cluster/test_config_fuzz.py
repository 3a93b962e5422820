"""Hostile configs (a fixed seed): the shipped configs with one to three values swapped for
wrong types, huge or non-finite numbers, empty or odd strings, or deleted. Whatever comes
in, loading it, rendering its Serve config, Kubernetes manifests and Grafana dashboard, and
checking it fits a node end in a result or a ConfigError that names the setting, never
another exception, in bounded memory and time. The cases run in a child process held to
2 GiB of address space and a hang guard: a config that makes a renderer allocate per
replica (`max_replicas: 1000000000`) ends the child, not the machine."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.conftest import HANG_S, ROOT

CASES = 1500
SEED = 20261130

_CHILD = textwrap.dedent("""
    import copy, json, random, resource, sys
    from pathlib import Path
    import yaml
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    from cluster.config import ConfigError, load_config
    from cluster.fit import check_fit
    from cluster.grafana.dashboard import dashboard_json
    from cluster.k8s.manifests import render
    from cluster.render import serve_config_yaml

    VALUES = [None, True, False, 0, -1, 1, 3, 64, 2**63, 2**64, -2**70, 10**9, 10**12, 1e308,
              float("inf"), float("-inf"), float("nan"), -0.0, 0.5, "", "x", "1", "-1", "nan",
              "1e400", "   ", "\\x00", "\\u00e9", [], [1], {}, {"a": 1}, "actor", "ingress",
              "auto", "2Gi"]
    DELETE = object()

    def paths(d, at=()):
        items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
        for k, v in items:
            yield at + (k,)
            yield from paths(v, at + (k,))

    seed, cases = int(sys.argv[1]), int(sys.argv[2])
    bases = [yaml.safe_load(p.read_text())
             for p in sorted(Path("deployments/configs").glob("*.yaml"))]
    rng, found = random.Random(seed), []
    for n in range(cases):
        d = copy.deepcopy(rng.choice(bases))
        for _ in range(rng.choice([1, 1, 2, 3])):
            where = rng.choice(list(paths(d)))
            parent = d
            for k in where[:-1]:
                parent = parent[k]
            value = rng.choice(VALUES + [DELETE])
            if value is DELETE:
                del parent[where[-1]]
            else:
                parent[where[-1]] = copy.deepcopy(value)
        stage = "load"
        try:
            config = load_config(d)
            stage = "serve config"
            serve_config_yaml(config)
            stage = "k8s manifests"
            render(config)
            stage = "dashboard"
            dashboard_json(config)
            stage = "fit on a 2-CPU node"
            check_fit(config, [{"CPU": 2.0, "memory": 8e9}])
        except ConfigError:
            continue
        except BaseException as e:  # MemoryError included: each case is reported
            found.append({"case": n, "stage": stage, "error": f"{type(e).__name__}: {e}"[:300],
                          "config": repr(d)[:2000]})
    print(json.dumps(found))
""")


def test_hostile_configs_end_in_a_result_or_a_config_error():
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(SEED), str(CASES)], cwd=ROOT,
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == [], json.dumps(found[:5], indent=1)
