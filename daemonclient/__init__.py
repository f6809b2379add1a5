"""The one layer between the storage daemon and every program that talks to it.

As httpx stacks models, transport, client and CLI, this package stacks, each on the one before:
``protocol`` (the wire, the error codes, the limits: no I/O) -> ``replies`` (what a reply means:
busy, unavailable, outcome unknown — by code and fields) -> ``transport`` (one request over ZeroMQ:
CURVE, store identity, timeouts, Lazy Pirate retries) and ``spawn`` (start a daemon when none
answers) -> ``core`` (``Daemon``: ensure, request ids, dispatch, retries the caller asks for, rebuild
polling). Above it sit the MCP front-end (``mcpfront``), the ``convmem`` CLI (``admin``) and the
transcript ingester (``ingest``); none of them imports another's client code, and nothing here
imports them or the MCP SDK. Importing this package loads nothing: import the module you need.
"""
