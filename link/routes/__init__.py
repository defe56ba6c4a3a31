"""The gateway's HTTP routes: `openai` (/v1), `policies` (/api/policies), `requests` (/api/requests),
`system` (/health, /metrics)."""
