"""The lab: benchmarks (`python -m zkl.bench`), tile probes, the roofline, the eager profile
and the supervised warm start. Nothing in the library imports them."""
