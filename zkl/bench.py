"""`python -m zkl.bench`: what zero mode costs, side by side (`zkl.experiments.bench`)."""

if __name__ == "__main__":
    from zkl.experiments.bench import entry

    entry()
