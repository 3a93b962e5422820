"""The one compiled part, optional: where no C compiler is, the install goes on without it
and the Python path it speeds up runs instead (deployments/protocol/_jsonfast.c)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("deployments.protocol._jsonfast",
                             ["deployments/protocol/_jsonfast.c"],
                             extra_compile_args=["-O2"], optional=True)])
