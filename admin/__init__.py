"""``convmem``: the administrator's command line — export, import, agent transcripts, health, rebuild.

It talks to the storage daemon through the same client layer as the MCP front-end (``daemonclient``:
the same transport, spawning, request ids and rebuild polling), so it needs no access to the data
directory, and it imports nothing of the front-end.
"""
