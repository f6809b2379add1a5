"""What the storage daemon and the MCP front-ends agree on.

Everything here is pure: no sockets, no files. Limits, error codes, the wire envelope and the
validation of every tool's arguments are defined once, here, and imported everywhere else.
"""
