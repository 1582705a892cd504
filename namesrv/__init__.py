"""namesrv."""
