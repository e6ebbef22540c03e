"""`python -m zkl.cert`: certify the config bitwise (`zkl.experiments.cert` says how)."""

if __name__ == "__main__":
    from zkl.experiments.cert import entry

    entry()
