"""Constrained decoding: a JSON Schema subset (or a structural tag) compiled into a character-level JSON
automaton, checked before any engine work, and used to mask each step's logits; a forcing `tool_choice`
becomes such a tag.
"""
