"""The wheel's packages: zkl's own, its Hydra launchers (`hydra_plugins.zkl_launchers`: Hydra
takes plugins from that namespace only), and the repository's top-level conf/ and sweeps/ as
`zkl._conf` and `zkl._sweeps`, where an installed zkl finds them (zkl/resources.py).
The rest of the metadata is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

SHIPPED = {"zkl._conf": "conf", "zkl._sweeps": "sweeps"}  # zkl/resources.py: PACKAGED

setup(
    packages=find_namespace_packages(include=["zkl*", "hydra_plugins.zkl*"]) + list(SHIPPED),
    package_dir=SHIPPED,
    package_data={name: ["**/*.yaml"] for name in SHIPPED},
)
