"""A run's whole config: the parts' dataclasses composed (schema), read from Hydra (compose),
and checked before any work (checks without torch, then validate), the checks that span parts
included.

Every part's package `__init__` is empty, so importing a part's `config` leaf loads the leaf
alone: the schema, the command-line checks and the config checks run in a fraction of a
second, and a refused command line never waits for torch (the architecture test keeps the
leaves free of anything heavier than `zkl.errors` and the `__init__`s empty).
"""
