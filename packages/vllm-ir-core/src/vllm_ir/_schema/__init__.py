"""The schema layer: what an op and an impl are, before any selection.

Impls and their signatures, sample inputs, tolerances, layout predicates,
argument binding and autograd. Imports only :mod:`vllm_ir._base`.
"""
