"""convmem's storage daemon: the only process that touches the data directory."""
