"""The engine's OpenAI frontend: a validated OpenAI request -> engine work -> an OpenAI response.

Shared by the engine's own HTTP server (`serving/api/server.py`) and the gateway's local backend
(`link/backends/local.py`): `responses.py` (request plans, whole and streamed answers), `chat_tools.py` (tools and
`response_format` on the chat endpoint), `logprobs.py` (logprobs objects from the engine's entries), `state.py`
(`EngineState`: one served engine) and `metrics.py` (its Prometheus metrics).
"""
