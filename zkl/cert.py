"""`python -m zkl.cert`: certify the config bitwise (`zkl.experiments.cert` says how).

`--help` and a refused command line answer before the certification (and torch) loads.
"""

if __name__ == "__main__":
    from zkl.cli import check_command_line
    from zkl.experiments.schema import CertRunConfig

    check_command_line("zkl.cert", CertRunConfig)
    from zkl.experiments.cert import entry

    entry()
