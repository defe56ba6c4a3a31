"""From logits to a token: the request's knobs (`SamplingParams`), the logits processors (logit bias,
`min_tokens`, penalties, temperature and truncation) and the seeded sampler with logprobs.
"""
