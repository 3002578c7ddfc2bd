"""The CPU's fast paths, kept apart from the reference path they speed up: weight products in bf16 where the CPU
multiplies bf16 natively and through weights prepacked once for oneDNN (`products`), and the LM head streamed
through the draw so a decode step's logits never leave the cache (`streamed_head`). Each gives the reference path's
values up to float summation order (and bf16 rounding where it multiplies in bf16); the sampler (`engine.sampling`)
and the lean forward (`engine.decoder`) choose them, and nothing outside the engine imports them.

Import rule: torch and `engine.choice` (the token-choice math) only.
"""
