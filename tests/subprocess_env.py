"""The environment for a pytest run started from inside a test: without the outer run's pytest-xdist
variables, which would make the inner run believe it is an xdist worker (its benchmarks disabled, its
end-of-session checks left to a controller that does not exist)."""

import os


def inner_pytest_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.pop("PYTEST_CURRENT_TEST", None)
    return {**env, **extra}
