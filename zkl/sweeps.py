"""`python -m zkl.sweeps`: the folder of the sweeps zkl ships, for `--config-dir`.

python -m zkl -m --config-dir "$(python -m zkl.sweeps)" --config-name precision_matrix
"""

from __future__ import annotations

from zkl.resources import sweeps_dir

if __name__ == "__main__":
    print(sweeps_dir())
