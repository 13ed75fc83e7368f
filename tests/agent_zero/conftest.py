"""The Agent Zero tests' fixtures. They live in `a0_harness` with the helpers the tests
import by that name: `from conftest import ...` picks whichever area's conftest came first
when several areas run in one pytest command."""

from a0_harness import a0_nats, checkout  # noqa: F401  (pytest finds fixtures here)
