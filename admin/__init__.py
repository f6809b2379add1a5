"""``convmem``: the administrator's command line — export, import, agent transcripts, health, rebuild.

It talks to the storage daemon through the same client layer as the MCP front-end (``daemonclient``:
the same transport, spawning, request ids and rebuild polling), never to the store's files, and it
imports nothing of the front-end; only ``status`` and ``stop`` look into the data directory, at the
daemon's pid file.
"""
