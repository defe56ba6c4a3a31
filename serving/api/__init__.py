"""A standalone OpenAI-compatible HTTP server for one engine (`link engine serve`)."""
