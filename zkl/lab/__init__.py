"""The lab: benchmarks (`python -m zkl.bench`), tile probes, the roofline, the eager profile,
the supervised warm start and the GGUF import. Nothing in the library imports them."""
