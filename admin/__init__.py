"""``convmem``: the administrator's command line — export, import, agent transcripts, health, rebuild.

It talks to the storage daemon exactly like an MCP front-end does (the same client, the same
request ids and retries), so it needs no access to the data directory.
"""
