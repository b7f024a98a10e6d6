"""The bus: wire messages, payload codec, shared-memory arenas, sockets."""
