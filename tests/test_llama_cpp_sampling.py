"""Speculative sampling on the llama.cpp backend follows the target distribution (docs/gguf.md,
"Exactness"): the shipped model's Q8_0 export, top-k 4 so three tokens have at most 64 outcomes,
whose exact joint probability is enumerated from fresh prefills; 2,000 seeded samples through the
real decode loop (batched K+1 verification, rollback by ``llama_memory_seq_rm``) are compared with
it by chi-square, for a deterministic draft and a draft sampled from its own q."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

pytest.importorskip("llama_cpp", reason="the llama.cpp backend needs: pip install 'codespec[gguf]'")
pytest.importorskip("gguf", reason="export needs gguf-py: pip install 'codespec[gguf]'")

from test_sampling_exact import ALPHA, always_accept, chi_square_p_value  # noqa: E402

from codespec.core.config import GenerationLimits, SamplingParams  # noqa: E402
from codespec.core.decode import generate_all  # noqa: E402
from codespec.core.default_model import target_path  # noqa: E402
from codespec.core.draft import Draft  # noqa: E402
from codespec.core.gguf_export import export_gguf  # noqa: E402
from codespec.core.llama_cpp_target import LlamaCppTarget  # noqa: E402
from codespec.core.sampling import process_logits  # noqa: E402

pytestmark = pytest.mark.slow

NEW_TOKENS = 3
SAMPLES = 2_000
SAMPLING = SamplingParams(temperature=1.0, top_k=4, top_p=1.0, seed=None)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> LlamaCppTarget:
    path = export_gguf(target_path(), tmp_path_factory.mktemp("gguf") / "default-q8_0.gguf", "q8_0")
    return LlamaCppTarget(path, threads=1)


@pytest.fixture(scope="module")
def prompt(target) -> list[int]:
    return target.encode("import os\nimport sys\n\n\ndef main(argv):\n    for name in argv:\n        print(")


def exact_joint(target, prompt) -> dict[tuple[int, ...], float]:
    joint = {(): 1.0}
    for _ in range(NEW_TOKENS):
        extended = {}
        for prefix, mass in joint.items():
            logits = target.forward([*prompt, *prefix], target.new_cache(), keep_last=1)[0]  # [V]
            probs = process_logits(logits, SAMPLING)  # [V]
            for token in torch.nonzero(probs > 0).flatten().tolist():
                extended[(*prefix, token)] = mass * float(probs[token])
        joint = extended
    return joint


class GreedyGuess:
    """A deterministic draft: the target's own most likely continuation (often right, not always)."""

    name = "lookup"

    def __init__(self, guess: list[int]) -> None:
        self.guess = guess

    def begin(self, prompt_ids):
        self.start = len(prompt_ids)

    def observe(self, outcome):
        pass

    def end(self):
        pass

    def propose(self, context):
        done = len(context.token_ids) - self.start
        return Draft(tuple(self.guess[done : done + context.max_len]), self.name)


class SampledDraft:
    """A draft sampled from its own q: most mass on the top candidates, in the wrong proportions."""

    name = "model"

    def __init__(self, candidates: list[int], vocab_size: int) -> None:
        self.q = torch.full((vocab_size,), 0.02 / vocab_size)
        for rank, token in enumerate(candidates):
            self.q[token] += 0.98 * [0.1, 0.2, 0.3, 0.4][rank % 4]
        self.q /= self.q.sum()

    def begin(self, prompt_ids):
        pass

    def observe(self, outcome):
        pass

    def end(self):
        pass

    def propose(self, context):
        probs = self.q.expand(context.max_len, -1)  # [K, V]
        tokens = torch.multinomial(probs, 1, generator=context.generator).squeeze(1)  # [K]
        return Draft(tuple(tokens.tolist()), self.name, draft_probs=probs)


def sample(target, prompt, proposer) -> Counter:
    counts: Counter = Counter()
    limits = GenerationLimits(max_new_tokens=NEW_TOKENS, max_draft_len=2)
    cache = target.new_cache()
    for seed in range(SAMPLES):
        sampling = SamplingParams(SAMPLING.temperature, SAMPLING.top_k, SAMPLING.top_p, seed)
        counts[generate_all(target, prompt, proposer, sampling, limits, cache=cache).token_ids] += 1
    return counts


@pytest.mark.parametrize("kind", ["deterministic-draft", "sampled-draft"])
def test_speculative_sampling_on_llama_cpp_matches_the_target(target, prompt, kind):
    joint = exact_joint(target, prompt)
    assert 8 <= len(joint) <= 4**NEW_TOKENS
    first = target.forward(prompt, target.new_cache())[0]
    top = torch.topk(first, 4).indices.tolist()
    if kind == "deterministic-draft":
        greedy = [top[0]]
        for _ in range(NEW_TOKENS):
            greedy.append(int(target.forward([*prompt, *greedy], target.new_cache())[0].argmax()))
        proposer = GreedyGuess(greedy)
    else:
        proposer = SampledDraft(top, target.vocab_size)
    counts = sample(target, prompt, proposer)
    assert chi_square_p_value(counts, joint, SAMPLES) > ALPHA


def test_the_check_has_power_here_too(target, prompt, monkeypatch):
    """The same samples under "always accept the draft" fail the test: it can tell."""
    import codespec.core.verify as verify_module

    monkeypatch.setattr(verify_module, "verify_lookup_sampling", always_accept)
    first = target.forward(prompt, target.new_cache())[0]
    wrong_guess = torch.topk(first, 4).indices.tolist()[1:]  # the second choice, drafted every time
    counts = sample(target, prompt, GreedyGuess(wrong_guess * 3))
    assert chi_square_p_value(counts, exact_joint(target, prompt), SAMPLES) < ALPHA
