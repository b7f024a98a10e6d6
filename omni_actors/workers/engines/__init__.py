"""Stage engines: one module per backend."""
