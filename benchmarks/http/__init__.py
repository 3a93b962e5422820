"""The HTTP front and protocols: the server, the front's own CPU, hostile clients, gRPC.

    front.py          the front in one process (uvicorn vs Raybatch's own server), wrk-driven
    front_path.py     CPU of Raybatch's own Python per HTTP request, no sockets or Ray
    front_hostile.py  the own server's bounds: a never-reading pipeliner, slowloris heads
    one_write.py      a probe: one socket write per response under uvicorn
    grpc_vs_http.py   tritonclient-style gRPC against HTTP on mlp
"""
