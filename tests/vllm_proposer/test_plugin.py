"""codespec's vLLM plug-in: a saved ``speculative_config`` naming the old top-level proposer path
fails with an error naming the new one, in this process and in vLLM's own loading path."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from codespec.vllm_proposer import plugin
from tests.vllm_proposer.test_real_vllm import CACHED

NEW_CLASS = "codespec.vllm_proposer.proposer.CodespecProposer"


@pytest.fixture
def registered():
    plugin.register()
    plugin.register()  # vLLM loads plug-ins once per process, but twice must not add two finders
    finders = [finder for finder in sys.meta_path if isinstance(finder, plugin.MovedProposerFinder)]
    assert len(finders) == 1 and sys.meta_path[-1] is finders[0]  # last: nothing real is shadowed
    yield
    sys.meta_path.remove(finders[0])


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("vllm_proposer.proposer", "codespec.vllm_proposer.proposer"),
        ("vllm_proposer.configured", "codespec.vllm_proposer.configured"),
    ],
)
def test_the_old_module_path_fails_naming_the_new_one(registered, old, new):
    with pytest.raises(ModuleNotFoundError) as error:
        importlib.import_module(old)
    assert (
        repr(new) in str(error.value) and NEW_CLASS in str(error.value) and "codespec vllm-config" in str(error.value)
    )
    importlib.import_module("codespec.vllm_proposer.proposer")  # the new path still imports


def test_the_finder_answers_the_old_package_itself():
    # (not imported here: under pytest, tests/vllm_proposer is importable by that name, and the
    # finder, last on the path, rightly leaves a real module of the name alone)
    with pytest.raises(ModuleNotFoundError, match="'codespec.vllm_proposer'"):
        plugin.MovedProposerFinder().find_spec("vllm_proposer", None)


def test_other_imports_pass_the_finder_by(registered):
    with pytest.raises(ModuleNotFoundError) as error:
        importlib.import_module("vllm_proposers_of_someone_else")
    assert "codespec" not in str(error.value)


VLLM_LOADS_THE_OLD_CLASS = """
import sys
from importlib.metadata import entry_points
if not any(e.value == "codespec.vllm_proposer.plugin:register" for e in entry_points(group="vllm.general_plugins")):
    sys.exit(3)
from types import SimpleNamespace
from vllm.plugins import load_general_plugins
from vllm.v1.spec_decode.custom_class_proposer import create_custom_proposer
load_general_plugins()
config = SimpleNamespace(speculative_config=SimpleNamespace(model="vllm_proposer.proposer.CodespecProposer"))
try:
    create_custom_proposer(config)
except ImportError as error:
    print(error)
    sys.exit(0)
sys.exit(4)
"""


def test_vllm_reports_the_new_path_for_a_saved_old_config():
    """vLLM's own plug-in loading and custom-class loading (0.32), in its environment."""
    if not CACHED.exists():
        pytest.skip(f"no vLLM environment at {CACHED}: run tests/vllm_proposer/setup_vllm.sh")
    done = subprocess.run([str(CACHED), "-c", VLLM_LOADS_THE_OLD_CLASS], capture_output=True, text=True, timeout=300)
    if done.returncode == 3:
        pytest.skip("the codespec installed in vLLM's environment has no vLLM plug-in (pip install -e this checkout)")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Cannot import module 'vllm_proposer.proposer'" in done.stdout and NEW_CLASS in done.stdout, done.stdout
