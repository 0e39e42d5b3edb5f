"""The suite's root conftest: the pytest plugin for a source checkout.

The hooks live in attention_conformance/pytest_plugin.py, which an installed suite (`pip install`,
editable or not) loads through its `pytest11` entry point. Here pytest registers the same module
under the same name when that entry point has not (a checkout used through PYTHONPATH alone):
pytest skips a plugin name already registered, so the hooks never run twice.
"""
pytest_plugins = ["attention_conformance.pytest_plugin"]
