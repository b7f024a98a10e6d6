"""The orchestrator: an event-driven actor routing requests through stage workers."""
