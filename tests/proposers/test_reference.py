"""The copy pointer: literal small cases, then whole-engine greedy equivalence with a tiny model."""

from __future__ import annotations

import os
import sysconfig

import pytest
from lookup_steps import cut_after, step_to

from codespec.core.draft import Draft, Outcome, ProposeContext
from codespec.proposers.lookup_sim import replay
from codespec.proposers.reference import ReferenceLookup, best_anchor
from codespec.proposers.registry import ProposerSetup, create_proposer
from codespec.proposers.token_bytes import TokenBytes

STDLIB = sysconfig.get_paths()["stdlib"]


def _corpus() -> list[str]:
    return [
        open(os.path.join(STDLIB, name), encoding="utf-8").read() for name in ("textwrap.py", "difflib.py", "heapq.py")
    ]


@pytest.fixture(scope="module")
def tokenizer():
    from bench.shapes import build_tokenizer

    return build_tokenizer(_corpus(), 1024)


@pytest.fixture(scope="module")
def codec(tokenizer):
    return TokenBytes(tokenizer)


def test_exact_copy_drafts_whole_spans_and_counts_prediction_tokens(codec):
    reference = "def area(width, height):\n    return width * height\n" * 6
    output_ids = codec.encode(reference)
    pointer = ReferenceLookup(reference, codec)
    stats = replay(pointer, [], output_ids, 32)
    assert len(stats.steps) == -(-len(output_ids) // 33)  # every forward: 32 accepted + 1 bonus
    assert all(step.accepted == step.draft_len for step in stats.steps)
    assert pointer.accepted_prediction_tokens == len(output_ids) - len(stats.steps)
    assert pointer.rejected_prediction_tokens == 0


def test_repeated_lines_keep_the_occurrence_being_copied(codec):
    block = "    total = total + value\n    count = count + 1\n"
    reference = "def f(values):\n" + block + block + block + "    return total\n"
    # The output inserts a comment inside the *third* copy of the block.
    output = (
        "def f(values):\n" + block + block + "    total = total + value\n    # seen\n"
        "    count = count + 1\n    return total\n"
    )
    pointer = ReferenceLookup(reference, codec)
    emitted = cut_after(codec, output, output.index(" count", output.index("# seen")))
    draft = step_to(pointer, [], emitted)
    third_count = len(("def f(values):\n" + block + block + "    total = total + value\n").encode())
    assert third_count <= pointer.position <= third_count + len(b"    ")  # the third copy's line
    assert codec.join(emitted) + codec.join(draft.token_ids) == output.encode()


def test_insertion_resumes_after_the_inserted_line(codec):
    reference = "def f(x):\n    y = x * 2\n    return y\n\n\ndef g(y):\n    return y\n"
    output = "def f(x):\n    y = x * 2\n    y = y + 1\n    return y\n\n\ndef g(y):\n    return y\n"
    pointer = ReferenceLookup(reference, codec)
    output_ids = codec.encode(output)
    stats = replay(pointer, [], output_ids, 64)
    inserted = len(codec.encode("    y = y + 1\n"))
    # One forward copies up to the insertion, the inserted tokens cost at most one forward each,
    # and once the pointer has re-anchored the rest of the file comes in one more.
    assert len(stats.steps) <= inserted + 3
    emitted = cut_after(codec, output, output.index(" return y"))
    draft = step_to(ReferenceLookup(reference, codec), [], emitted)
    assert codec.join(emitted) + codec.join(draft.token_ids) == output.encode()


def test_deletion_skips_the_deleted_text(codec):
    reference = "import os\nimport sys\nimport json\n\n\ndef main():\n    print(os.getcwd())\n"
    output = "import os\nimport json\n\n\ndef main():\n    print(os.getcwd())\n"
    pointer = ReferenceLookup(reference, codec)
    draft = step_to(pointer, [], codec.encode("import os\nimport json"))
    assert pointer.position == len(b"import os\nimport sys\nimport json")
    assert codec.join(draft.token_ids) == b"\n\n\ndef main():\n    print(os.getcwd())\n"
    stats = replay(ReferenceLookup(reference, codec), [], codec.encode(output), 64)
    assert len(stats.steps) <= 4


def test_output_tokens_split_differently_from_the_reference_stay_aligned(codec):
    reference = "    return value\n"
    reference_ids = codec.encode(reference)
    split_ids = codec.encode("    ret") + codec.encode("urn value\n")
    assert split_ids != reference_ids  # the same text, other token boundaries
    pointer = ReferenceLookup(reference, codec)
    emitted = codec.encode("    ret")
    context = ProposeContext(list(emitted), 0, 16)
    draft = pointer.propose(context)
    assert pointer.aligned and pointer.position == len(b"    ret")
    # The rest is the reference re-tokenized from inside its " return" token.
    assert codec.join(draft.token_ids) == b"urn value\n"
    assert draft.token_ids == tuple(codec.encode("urn value\n"))


@pytest.fixture(scope="module")
def multibyte_codec():
    """A vocabulary with multi-byte characters inside its tokens ("中文", "é")."""
    from bench.shapes import build_tokenizer

    return TokenBytes(build_tokenizer(_corpus()[:1] + ["中文 注释 中文\n" * 200 + "café ééé\n" * 200], 1024))


def test_an_output_token_ending_inside_a_character_keeps_the_pointer_on_the_text(multibyte_codec):
    """Byte-level tokens may split a UTF-8 character: the rest of it is drafted as byte tokens,
    then the reference from the next character."""
    codec = multibyte_codec
    reference = "x = '中文' + 'café'\nprint(x)\n" * 3
    lead = codec.encode("x = '")
    first_byte = codec.byte_id("中".encode()[0])
    assert first_byte is not None and codec.token(first_byte) == b"\xe4"
    pointer = ReferenceLookup(reference, codec)
    draft = pointer.propose(ProposeContext(lead + [first_byte], 0, 64))
    assert pointer.position == len(b"x = '") + 1
    assert codec.join(draft.token_ids) == reference.encode()[len(b"x = '") + 1 :][: len(codec.join(draft.token_ids))]
    assert codec.join(draft.token_ids[:2]) == "中".encode()[1:]
    assert len(codec.join(draft.token_ids)) > 40  # well past the split character
    # The whole reference, with every multi-byte character emitted byte by byte, stays aligned.
    assert any(len(codec.token(t)) > 1 and max(codec.token(t)) >= 0x80 for t in codec.encode(reference))
    output_ids = [
        i
        for t in codec.encode(reference)
        for i in ([codec.byte_id(b) for b in codec.token(t)] if any(b >= 0x80 for b in codec.token(t)) else [t])
    ]
    assert codec.join(output_ids) == reference.encode()
    pointer = ReferenceLookup(reference, codec)
    stats = replay(pointer, [], output_ids, 32)
    assert pointer.aligned and pointer.position == len(reference.encode())
    # Each split character costs at most one forward per token it became, where the output's
    # boundaries leave the reference's (no pointer knows how the output splits a character); every
    # character the output wrote whole is copied in the same forward as its neighbours.
    split_tokens = sum(1 for t in codec.encode(reference) if max(codec.token(t)) >= 0x80)
    assert len(stats.steps) <= -(-len(output_ids) // 33) + 3 * split_tokens


def test_observe_counts_only_its_own_drafts(codec):
    pointer = ReferenceLookup("abc def ghi\n", codec)
    ids = codec.encode("abc def ghi\n")
    pointer.begin([])
    draft = pointer.propose(ProposeContext([], 0, 4))
    pointer.observe(Outcome(draft, 1, tuple(ids[:2]), 2))
    pointer.observe(Outcome(Draft(tuple(ids[2:4]), "context"), 2, tuple(ids[2:5]), 5))
    assert (pointer.accepted_prediction_tokens, pointer.rejected_prediction_tokens) == (1, len(draft) - 1)


def test_anchor_trades_match_length_against_distance():
    text = b"x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n"
    tail = b"zz\nx = 1"
    lengths = [2, 4, 6]  # suffixes b"= 1"... at token boundaries
    # Equal lengths everywhere: the occurrence nearest the centre wins, before or after it.
    assert best_anchor(text, tail, lengths, 14, 100, 100, 1.0)[1:] == (17, 6)
    # Far from the centre a longer match must be much longer: here " = 1" next to the centre
    # beats "\nx = 1" 13 bytes away, unless distance weighs little.
    assert best_anchor(text, tail, lengths, 4, 100, 100, 1.0)[1:] == (5, 4)
    assert best_anchor(text, tail, lengths, 4, 100, 100, 0.25)[1:] == (17, 6)
    # Nothing of the tail occurs: no anchor.
    assert best_anchor(text, b"qq", [2], 0, 100, 100, 1.0)[0] == float("-inf")


def test_from_setup_needs_the_reference_text(tokenizer):
    class Target:
        pass

    target = Target()
    target.tokenizer = tokenizer
    with pytest.raises(ValueError, match="reference"):
        create_proposer("reference", ProposerSetup.from_options(target, {}))
    pointer = create_proposer("reference", ProposerSetup.from_options(target, {"reference": "pass\n"}))
    assert isinstance(pointer, ReferenceLookup)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    from bench.shapes import save_random_model
    from codespec.core.model import TargetModel

    directory = save_random_model(
        tmp_path_factory.mktemp("tiny"), _corpus(), "tiny", vocab_size=512, seed=3, init_std=0.2
    )
    return TargetModel.load(str(directory), device="cpu", dtype="float32")


def test_greedy_output_is_identical_with_the_copy_pointer(tiny_target):
    from codespec.core.config import GenerationLimits
    from codespec.core.decode import generate_all

    prompt_ids = tiny_target.encode("def merge(left, right):\n    result = []\n")
    limits = GenerationLimits(max_new_tokens=96, max_draft_len=32)
    plain = generate_all(tiny_target, prompt_ids, None, limits=limits)
    # A reference that has nothing to do with the output: drafts fail, output unchanged.
    unrelated = ReferenceLookup("while queue:\n    item = queue.pop()\n" * 4, tiny_target.tokenizer)
    assert generate_all(tiny_target, prompt_ids, unrelated, limits=limits).token_ids == plain.token_ids
    # The target's own greedy output as the reference: long drafts are accepted, same tokens.
    # (A random model's tokens are rarely the canonical tokenization of their text, so the
    # reference is given with the target's own ids, as a client sending prediction tokens would.)
    reference = tiny_target.decode(plain.token_ids)

    def encode(text: str) -> list[int]:
        return list(plain.token_ids) if text == reference else tiny_target.encode(text)

    forced = ReferenceLookup(reference, encode, tokenizer=tiny_target.tokenizer)
    copied = generate_all(tiny_target, prompt_ids, forced, limits=limits)
    assert copied.token_ids == plain.token_ids
    summary = copied.stats.summary()
    assert summary["target_forwards"] <= len(plain.token_ids) // 4
    assert summary["mean_accepted_length"] >= 8
    assert forced.accepted_prediction_tokens >= len(plain.token_ids) // 2


def test_inserted_text_is_drafted_from_the_request_itself_and_not_counted_as_prediction(codec):
    reference = "import os\n\n\ndef main():\n    print(os.getcwd())\n"
    line = "    print(os.environ.get('HOME', '/root'))\n"
    output = "import os\n\n\ndef main():\n" + line + "    print(os.getcwd())\n" + line
    output_ids = codec.encode(output)
    emitted = cut_after(codec, output, output.rindex("    print(os.environ") + len("    print(os.env"))
    pointer = ReferenceLookup(reference, codec)
    draft = step_to(pointer, [], emitted)
    # The repeated line is nowhere in the reference, but the output already holds it.
    assert draft.match.source == "context"
    assert (codec.join(emitted) + codec.join(draft.token_ids)).startswith(output.encode())
    plain = ReferenceLookup(reference, codec, own_text=False)
    assert len(replay(ReferenceLookup(reference, codec), [], output_ids, 32).steps) < len(
        replay(plain, [], output_ids, 32).steps
    )
    counted = ReferenceLookup(reference, codec)
    stats = replay(counted, [], output_ids, 32)
    from_reference = [s for s in stats.steps if s.draft_len]  # context drafts are not prediction tokens
    assert counted.accepted_prediction_tokens < sum(s.accepted for s in from_reference)


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st

TEXT = st.lists(st.sampled_from(list("ab (),:=\n    é中") + ["def ", "return ", "self."]), min_size=1, max_size=60).map(
    "".join
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT, cut=st.floats(0, 1))
def test_any_text_split_anywhere_is_copied_in_long_drafts(codec, text, cut):
    """The output is the reference, tokenized in two pieces split at any character (so its token
    boundaries differ from the reference's around the split): the pointer never loses it. Each
    output token that is not a reference token at the same offset may cost a forward of its own
    (no pointer can know how the output splits a word), and the split may cut one draft short."""
    split = int(len(text) * cut)
    output_ids = codec.encode(text[:split]) + codec.encode(text[split:])

    def placed(ids):
        offsets = [0]
        for token_id in ids:
            offsets.append(offsets[-1] + len(codec.token(token_id)))
        return set(zip(offsets, ids))

    foreign = len(placed(output_ids) - placed(codec.encode(text)))
    pointer = ReferenceLookup(text, codec)
    stats = replay(pointer, [], output_ids, 8)
    assert len(stats.steps) <= -(-len(output_ids) // 9) + foreign + 1
    assert pointer.position == len(text.encode())


def test_tokenizer_forms_and_edge_cases(tokenizer, codec):
    from codespec.index import TokenizerAdapter

    text = "value = compute(1)\n"
    expected = tuple(codec.encode(text))
    for encode in (tokenizer, TokenizerAdapter(tokenizer), tokenizer.encode, codec):
        pointer = ReferenceLookup(text, encode)
        assert pointer.propose(ProposeContext([7], 1, 32)).token_ids == expected
    # An empty reference never drafts, whatever the output does.
    empty = ReferenceLookup("", codec)
    assert empty.propose(ProposeContext([7], 1, 8)).is_empty
    assert empty.propose(ProposeContext([7, *expected], 1, 8)).is_empty
    # A pointer may start inside the reference (a completion's cursor).
    middle = ReferenceLookup(text, codec, start=len("value = "))
    assert codec.join(middle.propose(ProposeContext([7], 1, 32)).token_ids) == b"compute(1)\n"


def test_match_length_grows_while_copying_and_restarts_at_a_reanchoring(codec):
    """auto buckets its acceptance statistics by match length: a pointer that has copied for a
    while must report a longer match than one that just re-anchored after an edit."""
    original = "".join(f"def f{i}(value):\n    return value * {i} + {i}\n\n" for i in range(8))
    edited = original.replace("return value * 3 + 3", "result = value ** 3\n    return result - 3")
    pointer = ReferenceLookup(original, codec)
    early = step_to(pointer, [], cut_after(codec, edited, 20)).match.match_len
    pointer = ReferenceLookup(original, codec)
    before_edit = edited.index("result = value")
    late = step_to(pointer, [], cut_after(codec, edited, before_edit - 1)).match.match_len
    assert late > early + 20  # every confirmed token counts
    pointer = ReferenceLookup(original, codec)
    after_edit = edited.index("return result - 3") + len("return result - 3\n\n")
    reanchored = step_to(pointer, [], cut_after(codec, edited, after_edit + 12))
    assert reanchored.token_ids and reanchored.match.match_len < late  # a fresh anchoring starts again


def test_pieces_are_each_tokens_bytes(tokenizer):
    """``TokenBytes.pieces`` (the table read in C) gives ``token`` for every id, and the copy
    pointer's offsets and bytes follow from them."""
    codec = TokenBytes(tokenizer)
    ids = codec.encode("def área(w, h):\n    return w * h  # ok\n")
    fresh = TokenBytes(tokenizer)
    assert fresh.pieces(ids) == [codec.token(t) for t in ids]
    pointer = ReferenceLookup("def área(w, h):\n    return w * h  # ok\n", codec)
    offsets = [sum(len(codec.token(t)) for t in pointer._ids[:n]) for n in range(len(pointer._ids))]
    assert pointer._starts == offsets and pointer._ref == codec.join(pointer._ids)
    assert pointer._index_at == {offset: n for n, offset in enumerate(offsets)}


class Recording:
    """A proposer's drafts, step by step (the test compares two pointers' drafts exactly)."""

    def __init__(self, proposer) -> None:
        self.proposer, self.name, self.drafts = proposer, proposer.name, []

    def begin(self, prompt_ids):
        self.proposer.begin(prompt_ids)

    def propose(self, context):
        draft = self.proposer.propose(context)
        self.drafts.append((draft.token_ids, draft.match))
        return draft

    def observe(self, outcome):
        self.proposer.observe(outcome)

    def end(self):
        self.proposer.end()


def test_inserted_text_drafts_alike_from_the_requests_context_table_and_from_a_table_of_its_own(codec):
    """Under auto the copy pointer drafts inserted text from the context lookup's table over the
    whole sequence (read within the output) instead of a second table over the output: every
    draft must be the one its own table gives, with the prompt holding the reference (so n-grams
    of the prompt and ones spanning into the output are in the shared table and must not match)."""
    from codespec.proposers.context import ContextLookup

    source = _corpus()[0][:3000]
    lines = source.splitlines(keepends=True)
    edited = []
    for number, line in enumerate(lines):  # insertions that repeat earlier output, deletions, changes
        if number % 7 == 3:
            edited += [line, "    # checked: " + line.strip()[:30] + "\n", line]
        elif number % 11 == 5:
            continue
        else:
            edited.append(line.replace("self", "this") if number % 5 == 0 else line)
    prompt_ids = codec.encode("Rewrite it.\n" + source + "\nDone:\n")
    output_ids = codec.encode("".join(edited))
    own = Recording(ReferenceLookup(source, codec))
    shared = Recording(ReferenceLookup(source, codec, own_text=ContextLookup()))
    own_stats = replay(own, prompt_ids, output_ids, 16)
    shared_stats = replay(shared, prompt_ids, output_ids, 16)
    assert shared.drafts == own.drafts
    assert [(s.draft_len, s.accepted) for s in shared_stats.steps] == [
        (s.draft_len, s.accepted) for s in own_stats.steps
    ]
    assert sum(1 for _, match in own.drafts if match is not None and match.source == "context") >= 5
