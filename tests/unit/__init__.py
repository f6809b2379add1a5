"""Tests that start no process and open no socket: pure functions and a store, an index, a parser or a
validator driven in-process. Marked ``unit`` by ``tests/conftest.py``."""
