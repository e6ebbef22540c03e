"""Megatron-core engines: megatron-core GPT models with zkl's fixes plugged in through specs.

`mapping` and `check` are pure and import everywhere (CPU CI, Python 3.11); `spec` and
`model` import megatron-core and are loaded only when a megatron engine is built.
"""
