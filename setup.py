"""Package layout only (metadata lives in pyproject.toml).

The checkout's top-level folders backends/, cases/ and references/ install under the harness namespace
(harness.backends, ...), so that installing this project adds no generic top-level module names to an
environment; harness/__init__.py finds them beside the package in a checkout.
"""

from setuptools import find_packages, setup

NAMESPACED = ("backends", "cases", "references")

packages = find_packages(include=["harness", "harness.*"])
package_dir = {"harness": "harness"}
for top in NAMESPACED:
    package_dir[f"harness.{top}"] = top
    packages += [f"harness.{p}" for p in find_packages(include=[top, top + ".*"])]

setup(packages=packages, package_dir=package_dir)
