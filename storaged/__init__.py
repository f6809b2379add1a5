"""convmem's storage daemon: the only process that reads or writes the store (log, snapshot, cursor key).

Other processes see only what sits beside the store for them: the daemon's pid file, its store id,
and the HTTP front-end's token file.
"""
