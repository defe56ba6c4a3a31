"""The tool-call harness: tools written into the system turn in a chosen format (JSON or XML call
styles), calls in the model's text parsed back into OpenAI `tool_calls`, echoed tool results cut out.
"""
