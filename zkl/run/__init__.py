"""A run's whole config: the parts' dataclasses composed (schema), read from Hydra (compose),
and checked before any work (validate), the checks that span parts included."""
