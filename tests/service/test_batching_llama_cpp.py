"""The scheduler on the llama.cpp backend: a cycle's sequences go into one ``llama_decode`` (one
``seq_id`` each), and each request gets the output it gets alone. llama.cpp's kernels are not
batch invariant (docs/gguf.md, "Exactness"): with flash attention off the logits of a sequence
alone and in a batch differ by ~1e-5, under any argmax gap the shipped model's prompts have."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend needs: pip install 'codespec[gguf]'")
pytest.importorskip("gguf", reason="export needs gguf-py: pip install 'codespec[gguf]'")

from test_batching import WAIT_S, requests  # noqa: E402

from codespec.core.default_model import target_path  # noqa: E402
from codespec.core.gguf_export import export_gguf  # noqa: E402
from codespec.core.llama_cpp_target import LlamaCppTarget  # noqa: E402
from codespec.service.engine.service import EngineService  # noqa: E402


@pytest.fixture(scope="module")
def gguf_target(tmp_path_factory) -> LlamaCppTarget:
    path = export_gguf(target_path(), tmp_path_factory.mktemp("gguf") / "default-q8_0.gguf", "q8_0")
    return LlamaCppTarget(path, threads=1)


def serve(target, jobs, **options) -> tuple[list[str], dict]:
    service = EngineService(target, proposer="auto", max_draft=8, **options)
    try:
        submitted = [service.submit(request) for request in jobs]
        return [job.wait(WAIT_S).text for job in submitted], service.snapshot()
    finally:
        service.close()


def test_requests_batched_on_llama_cpp_get_their_alone_output(gguf_target):
    """Greedy requests: the same tokens. The sampled one draws from the same distribution, but
    auto's draft lengths follow measured times here (not a fixed cost model), and a different
    draft consumes the seeded stream differently, so its text is not compared."""
    greedy = [i for i, request in enumerate(requests()) if request.sampling.temperature == 0]
    assert len(greedy) == len(requests()) - 1
    alone = [serve(gguf_target, [request])[0][0] for request in requests()]
    together, stats = serve(gguf_target, requests())
    assert [together[i] for i in greedy] == [alone[i] for i in greedy]
    assert all(together) or not all(alone)
    # the completions share forwards; the rewrite joins them one cycle in MAX_YIELD + 1
    assert stats["batching"]["largest_batch"] >= len(requests()) - 1
    forwards = sum(entry["target_forwards"] for entry in stats["last_requests"])
    assert stats["batching"]["cycles"] < forwards  # sequences shared llama_decode calls


def test_the_batch_is_bounded_by_the_llama_cpp_kv_buffer(gguf_target):
    service = EngineService(gguf_target, proposer="auto", max_cached_tokens=10**6)
    try:
        assert service.scheduler.max_cached_tokens == gguf_target.kv_capacity
    finally:
        service.close()
