"""The pytest plugin's public module: the entry point (pyproject.toml) and conftest.py name it, and users'
own conftest files may. Its hooks live in harness/front/pytest_plugin.py."""

from .front.pytest_plugin import *  # noqa: F401,F403 - the hooks, as pytest finds them by name
