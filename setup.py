"""The compiled parts, optional: where no C compiler is, the install goes on without them
and the Python paths they speed up run instead (deployments/protocol/_jsonfast.c, the
JSON tensor reader; deployments/http/native/_front.c, the native front of the HTTP server, with
llhttp, the parser the Python server uses through httptools, built in)."""

from setuptools import Extension, setup

LLHTTP = "deployments/http/native/llhttp"

setup(ext_modules=[
    Extension("deployments.protocol._jsonfast", ["deployments/protocol/_jsonfast.c"],
              extra_compile_args=["-O2"], optional=True),
    Extension("deployments.http.native._front",
              ["deployments/http/native/_front.c", *(f"{LLHTTP}/{name}.c" for name in
                                              ("api", "http", "llhttp"))],
              include_dirs=[LLHTTP], extra_compile_args=["-O2", "-Wall"], optional=True),
])
