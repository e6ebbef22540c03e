"""Experiments over zkl: certification (`python -m zkl.cert`), the fix ablation, and the
benchmarks (`python -m zkl.bench`). Nothing in the library imports them."""
