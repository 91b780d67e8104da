"""The vLLM tests run against the real vLLM package, in the venv `make setup-vllm` builds.

In the main venv (no vLLM) they are skipped with that reason; `make test-vllm` sets
``MONO_AOT_REQUIRE_VLLM=1``, under which a missing vLLM is a failure, not a skip.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # no GPU here: vLLM's CPU platform


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("MONO_AOT_REQUIRE_VLLM"):
        raise pytest.UsageError("MONO_AOT_REQUIRE_VLLM=1 but vllm is not importable")
    skip = pytest.mark.skip(reason="vllm is not installed here: run `make test-vllm`")
    for item in items:
        if "tests/vllm/" in item.nodeid:
            item.add_marker(skip)


from tests.runtime.conftest import stand_in_lib  # noqa: E402, F401 - the stand-in HIP library
