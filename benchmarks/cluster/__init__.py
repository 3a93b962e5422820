"""Clusters of real hosts on one machine, for multi-host tests and benchmarks.

    lab.py      hosts made of network namespaces: own address, /tmp; faults; the sweep
    cgroups.py  each host's CPU quota (cgroup v2, or v1's cpu), its processes, killing them
    labray.py   Ray on the lab: the head, a node on each host, waiting for the nodes
    names.py    the `rblab-*` names, the head's address, LabError, running a command
"""
