"""What the storage daemon and the MCP front-ends agree on.

Everything here is pure: no sockets, and no files but the daemon's one-line pid file
(``config.read_pid``). Limits, error codes, the wire envelope, the validation of every tool's
arguments and the requests it builds (``requests``: what the daemon's handlers receive), and the data
directory's file names are defined once, here, and imported everywhere else.
"""
