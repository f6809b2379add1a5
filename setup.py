"""What pyproject.toml cannot yet say in a stable form: the C extension (storaged/postings.c, the search
index's posting appends; setuptools calls ``[tool.setuptools.ext-modules]`` experimental). Optional, so
that a machine without a C compiler still installs, and indexes through SearchIndex's Python path (~1.6x
slower); the test suite requires it (tests/unit/test_native_postings.py). Everything else is in
pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("convmem_postings", sources=["storaged/postings.c"], optional=True)])
