"""The generation loop: requests become sequences, the scheduler batches prefills and decodes over a paged
KV cache (block managers, full and sliding-window), the model runner runs one forward pass per step, and
each step's tokens are sampled, checked against stop conditions and streamed back as `RequestOutput`s.
"""
