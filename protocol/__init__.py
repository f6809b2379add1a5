"""What the storage daemon and the MCP front-ends agree on.

Everything here is pure: no sockets, no files. Limits, error codes, the wire envelope, the
validation of every tool's arguments and the requests it builds (``requests``: what the daemon's
handlers receive) are defined once, here, and imported everywhere else.
"""
