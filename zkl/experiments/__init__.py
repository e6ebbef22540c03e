"""Experiments on the framework: certification, fix ablation and benchmarks."""
