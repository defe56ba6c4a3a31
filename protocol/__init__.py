"""The wire formats that the engine's server (`serving/api/`) and the gateway (`link/`) both speak.

OpenAI's request schemas and usage object (`openai.py`), its error object and field paths (`errors.py`), strict
checks of a chat request's nested fields (`chat_fields.py`), request bodies read as strict JSON (`strict_json.py`,
with `url_params.py` holding path and query parameters to the same rule), the request boundary that bounds a body's
size and nesting before anything parses it (`boundary.py`, `json_depth.py`), server-sent event framing (`sse.py`)
and cancelling work when the client leaves (`disconnect.py`). Every package may import `protocol`; it imports no
other package of ours.
"""
