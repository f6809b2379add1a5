"""``convmem``: the administrator's command line — export, import, agent transcripts, health, rebuild.

It talks to the storage daemon through the same client as the MCP front-ends (the same request ids
and retries), never to the store's files; only ``status`` and ``stop`` look into the data directory,
at the daemon's pid file.
"""
