"""The offline replay of vLLM's completions: its ngram rule is vLLM's, a verified step is vLLM's,
and codespec's drafter is driven as vLLM drives it."""

from transformers import AutoTokenizer

from bench.vllm_replay import ReplayClock, accept, ngram_draft, replay_codespec, replay_rule
from codespec.core.default_model import target_path
from codespec.vllm_proposer.drafter import BatchDrafter
from codespec.vllm_proposer.options import DrafterOptions


def test_the_ngram_rule_is_vllms_longest_suffix_at_its_earliest_occurrence():
    assert ngram_draft([1, 2, 3, 4, 2, 3], 4) == [4, 2, 3]  # vLLM's docstring example
    # the longest suffix that occurred wins over a shorter one that occurred earlier
    assert ngram_draft([8, 9, 6, 1, 7, 8, 9, 5, 0, 7, 8, 9], 2) == [5, 0]
    # among occurrences of the same suffix, the earliest
    assert ngram_draft([4, 5, 1, 4, 5, 2, 4, 5], 1) == [1]
    assert ngram_draft([1, 2, 3, 9], 4) == []  # a one-token suffix is below the minimum n
    assert ngram_draft([3, 3, 3], 4) == [3]  # the draft may run into the suffix itself, and no further


def test_a_step_accepts_the_matching_prefix_and_samples_the_last_token_itself():
    assert accept([5, 6, 7], [5, 6, 9, 1]) == 2
    assert accept([5, 6, 7], [5, 6, 7]) == 2  # the output's last token is sampled, not accepted
    assert accept([], [1]) == 0


def test_a_repeated_output_is_drafted_by_the_rule_and_by_codespecs_drafter():
    tokenizer = AutoTokenizer.from_pretrained(target_path())
    text = "def area(width, height):\n    return width * height\n\n\n"
    prompt = tokenizer.encode(text * 2)
    output = tokenizer.encode(text)
    drafted, accepted = replay_rule(prompt, output, 16)
    assert accepted >= len(output) - 4 and drafted >= accepted
    clock = ReplayClock()
    drafter = BatchDrafter(tokenizer, 16, 4096, DrafterOptions(proposer="context"), clock=clock)
    drafted, accepted, seconds = replay_codespec(drafter, clock, prompt, output, 0.002, 0.0003)
    assert accepted >= len(output) - 4 and drafted >= accepted
    steps = clock.steps
    assert steps == len(output) - 1 - accepted  # every step emits its accepted drafts and one more
    assert seconds > 0.002 * steps and drafter.stats.sequences == 1


def test_requests_in_flight_at_once_share_each_step_and_its_cost():
    """The batched replay: every live row is in each step, a step costs its fixed part once and
    each row's part per row, and a finished request's client sends the next one."""
    from bench.vllm_replay import replay_batched

    prompts, outputs = [[1, 2], [3, 4], [5, 6]], [[7, 8, 9], [10, 11, 12, 13, 14], [15, 16]]
    batches: list[int] = []

    def plain_step(live):
        batches.append(len(live))
        return [[] for _ in live]

    plain = replay_batched(plain_step, prompts, outputs, 2, 1.0, 0.1)
    # 2 and 4 tokens left in the first two requests (one came with the prefill); the third takes
    # the first one's slot in the step after it is done, and needs one step
    assert batches == [2, 2, 2, 1]
    assert plain["steps"] == 4 and plain["accepted"] == 0
    assert abs(plain["decode_s_modeled"] - (4 * 1.0 + (2 + 2 + 2 + 1) * 0.1)) < 1e-9

    def oracle(live):
        return [c.output[len(c.tokens) - len(c.prompt) :] for c in live]

    known = replay_batched(oracle, prompts, outputs, 2, 1.0, 0.1)
    assert known["steps"] == 2 and known["accepted"] == (2 - 1) + (4 - 1) + (1 - 1)
    one_at_a_time = replay_batched(oracle, prompts, outputs, 1, 1.0, 0.1)
    assert one_at_a_time["steps"] == 3 and one_at_a_time["accepted"] == known["accepted"]


def test_the_drafter_cost_bench_times_each_part_and_puts_the_drafter_back():
    """``bench.vllm_drafter_cost``: each part's calls and time, counted inside the replay, and the
    drafter's methods as they were once the run is over."""
    from argparse import Namespace

    from bench.vllm_drafter_cost import PARTS, one_run

    tokenizer = AutoTokenizer.from_pretrained(target_path())
    text = "def area(width, height):\n    return width * height\n\n\n"
    prompts = [tokenizer.encode(text * 2), tokenizer.encode("# " + text * 2)]
    outputs = [tokenizer.encode(text)] * 2
    before = {name: getattr(cls, method) for name, (cls, method) in PARTS.items()}
    args = Namespace(workload="heldout-edits", proposer="auto", k=8, clients=2, step_ms=2.17, row_ms=0.28)
    run = one_run(tokenizer, args, prompts, outputs, 128)
    assert {name: getattr(cls, method) for name, (cls, method) in PARTS.items()} == before
    parts = run["parts"]
    assert parts["step"]["calls"] == run["steps"] + 1  # the replay's steps and the last, empty one
    assert parts["output recorded"]["calls"] == 2 and parts["rows followed"]["calls"] == parts["step"]["calls"]
    assert parts["planning (auto, lookups included)"]["ms"] > 0 and parts["context lookup"]["ms"] > 0
    assert run["accepted"] > 0
