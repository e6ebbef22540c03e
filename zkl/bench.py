"""`python -m zkl.bench`: what zero mode costs, side by side (`zkl.experiments.bench`).

`--help` and a refused command line answer before the benchmark (and torch) loads.
"""

if __name__ == "__main__":
    from zkl.cli import check_command_line
    from zkl.experiments.schema import BenchRunConfig

    check_command_line("zkl.bench", BenchRunConfig)
    from zkl.experiments.bench import entry

    entry()
