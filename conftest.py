# Repo-level pytest wiring: load the harness plugin (its options: --harness-backend / --backend, --kernel,
# --sizes, --plugin, ...). When the project is installed, the plugin is already registered through its entry
# point under the same name, and this line is a no-op.
pytest_plugins = ["harness.pytest_plugin"]
