"""The capture tests' fixtures and hook. They live in `capture_harness` with the helpers the
tests import by that name: `from conftest import ...` picks whichever area's conftest came
first when several areas run in one pytest command."""

from capture_harness import engine, harness, pytest_configure, server  # noqa: F401
