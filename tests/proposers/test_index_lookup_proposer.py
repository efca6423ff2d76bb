"""Index lookup over a real WorkspaceIndex: sources, tie-breaking, outcome statistics, equivalence."""

from __future__ import annotations

import json
import os
import sysconfig

import pytest
from lookup_steps import cut_after, step_to

from codespec.core.draft import EMPTY_DRAFT, Draft, MatchInfo, Outcome, ProposeContext
from codespec.index import WorkspaceIndex
from codespec.proposers.index_lookup import IndexLookup
from codespec.proposers.lookup_sim import replay
from codespec.proposers.registry import ProposerSetup, create_proposer
from codespec.proposers.token_bytes import TokenBytes

STDLIB = sysconfig.get_paths()["stdlib"]
CLIENT = (
    "class Client:\n"
    "    def send(self, request, timeout=None):\n"
    "        response = self.transport.handle(request)\n"
    "        response.raise_for_status()\n"
    "        return response\n"
)


def _corpus() -> list[str]:
    return [open(os.path.join(STDLIB, name), encoding="utf-8").read() for name in ("textwrap.py", "heapq.py")]


@pytest.fixture(scope="module")
def tokenizer():
    from bench.shapes import build_tokenizer

    return build_tokenizer(_corpus(), 1024)


@pytest.fixture
def index(tokenizer):
    workspace = WorkspaceIndex(tokenizer)
    workspace.add_document("client.py", CLIENT, 1)
    return workspace


def test_drafts_the_workspace_continuation_and_reports_its_source(index, tokenizer):
    codec = TokenBytes(tokenizer)
    context_ids = codec.encode("def fetch(client, request):\n    response = self.transport.handle(")
    proposer = IndexLookup(index)
    proposer.begin(context_ids)
    draft = proposer.propose(ProposeContext(context_ids, len(context_ids), 12))
    assert draft.match.source == "client.py" and draft.match.match_len >= 2
    assert codec.join(draft.token_ids).startswith(b"request)\n        response.ra")  # 12 tokens
    proposer.observe(Outcome(draft, 3, tuple(draft.token_ids[:4]), len(context_ids) + 4))
    assert index.source_stats("client.py") == (len(draft), 3)


def test_the_longer_match_wins_and_the_request_itself_counts(index, tokenizer):
    codec = TokenBytes(tokenizer)
    # The request's own text repeats a longer stretch than anything in the workspace.
    own = "    response = self.transport.handle(request, stream=True)\n"
    context_ids = codec.encode(own + "log(x)\n" + "    response = self.transport.handle(request,")
    proposer = IndexLookup(index)
    proposer.begin(context_ids)
    draft = proposer.propose(ProposeContext(context_ids, len(context_ids), 8))
    assert draft.match.source == "context"
    assert codec.join(draft.token_ids).startswith(b" stream=True)")
    # Without the request's own text the workspace's shorter match is what is left.
    alone = IndexLookup(index, use_context=False)
    alone.begin(context_ids)
    assert alone.propose(ProposeContext(context_ids, len(context_ids), 8)).match.source == "client.py"


def test_a_completion_does_not_draft_itself_from_its_own_document(tokenizer):
    codec = TokenBytes(tokenizer)
    prefix = "def a():\n    return compute(1)\n\n\ndef b():\n    return compute("
    suffix = "2)\n\n\ndef c():\n    return compute(1)\n"
    workspace = WorkspaceIndex(tokenizer)
    workspace.add_document("doc.py", prefix + suffix, 1)
    proposer = create_proposer(
        "index", ProposerSetup.from_options(None, {"index": workspace, "uri": "doc.py", "cursor": len(prefix)})
    )
    context_ids = codec.encode(prefix)
    proposer.begin(context_ids)
    draft = proposer.propose(ProposeContext(context_ids, len(context_ids), 4))
    assert not codec.join(draft.token_ids).startswith(b"2)")  # the cursor's own continuation is skipped
    assert codec.join(draft.token_ids).startswith(b"1)")


def test_needs_an_index():
    with pytest.raises(ValueError, match="index"):
        create_proposer("index", ProposerSetup.from_options(None, {}))


def test_replay_of_a_copied_file_uses_long_drafts(index, tokenizer):
    codec = TokenBytes(tokenizer)
    output_ids = codec.encode(CLIENT)
    stats = replay(IndexLookup(index), codec.encode("# client\n"), output_ids, 32)
    # The first tokens have no match yet; from then on the document is copied in long drafts.
    assert len(stats.steps) <= 8
    assert index.source_stats("client.py")[1] >= len(output_ids) - 10


def test_greedy_output_is_identical_with_index_lookup(tmp_path):
    from bench.shapes import save_random_model
    from codespec.core.config import GenerationLimits
    from codespec.core.decode import generate_all
    from codespec.core.model import TargetModel

    target = TargetModel.load(
        str(save_random_model(tmp_path / "tiny", _corpus(), "tiny", vocab_size=512, seed=5, init_std=0.2)),
        device="cpu",
        dtype="float32",
    )
    prompt_ids = target.encode("def push(heap, item):\n    heap.append(item)\n")
    limits = GenerationLimits(max_new_tokens=64, max_draft_len=16)
    plain = generate_all(target, prompt_ids, None, limits=limits)
    workspace = WorkspaceIndex(target.tokenizer)
    workspace.add_document("heap.py", _corpus()[1][:4000], 1)
    # The target's own output in the history: drafts get accepted, and the output must not change.
    workspace.add_history("generated", target.decode(plain.token_ids))
    proposer = IndexLookup(workspace)
    with_index = generate_all(target, prompt_ids, proposer, limits=limits)
    assert with_index.token_ids == plain.token_ids
    assert sum(step.draft_len for step in with_index.stats.steps) > 0


def test_simulate_completions_with_a_workspace(tokenizer, tmp_path):
    from codespec.commands.cli import main

    tokenizer.save_pretrained(tmp_path / "tok")
    workspace = tmp_path / "ws.jsonl"
    workspace.write_text(json.dumps({"path": "client.py", "text": CLIENT}) + "\n")
    cases = [
        {
            "id": f"c{n}",
            "path": "app.py",
            "prefix": f"def call_{n}(self, request):\n        response = self.transport.handle(request)\n",
            "suffix": "\n",
            "target": "        response.raise_for_status()\n        return response\n",
        }
        for n in range(3)
    ]
    workload = tmp_path / "completions.jsonl"
    workload.write_text("".join(json.dumps(c) + "\n" for c in cases))
    out = tmp_path / "report.json"
    assert (
        main(
            [
                "simulate",
                "--workload",
                str(workload),
                "--workspace",
                str(workspace),
                "--tokenizer",
                str(tmp_path / "tok"),
                "--proposer",
                "index",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())["proposers"]
    assert rows["index"]["tokens_per_forward"] > 2 * rows["hf-rule"]["tokens_per_forward"]


# -- literal small cases: repeated blocks, insertion, deletion, other token boundaries -------------

LINES = "    total = total + value\n    count = count + 1\n"  # 21 tokens: longer than the longest match


def block(mark: str) -> str:
    """Repeated lines, a line that tells the copies apart, the repeated lines again."""
    return LINES + f"    mark({mark!r})\n" + LINES


MARKS = ("alpha", "beta", "gamma", "delta", "epsilon")
BLOCKS = "def f(values):\n" + "".join(block(mark) for mark in MARKS) + "    return total\n"
EDIT_PROMPT = "# edited\n"  # occurs nowhere in the indexed documents


def one_document(tokenizer, text: str, uri: str = "doc.py") -> WorkspaceIndex:
    workspace = WorkspaceIndex(tokenizer)
    workspace.add_document(uri, text, 1)
    return workspace


@pytest.mark.parametrize("max_draft", [3, 6])
@pytest.mark.parametrize("mark", MARKS)
def test_repeated_blocks_keep_the_occurrence_being_copied(tokenizer, mark, max_draft):
    """The output re-types the document from one block on. Inside the repeated lines every copy
    matches the context equally (the lines are longer than ``max_ngram``), so only the cursor
    tells them apart: it starts on the block and must follow the copying, or a short draft that
    reaches a ``mark(...)`` line drafts another block's mark."""
    codec = TokenBytes(tokenizer)
    assert len(codec.encode(LINES)) > 8  # the default max_ngram
    start = BLOCKS.index(block(mark))
    proposer = IndexLookup(one_document(tokenizer, BLOCKS), uri="doc.py", cursor=start)
    output_ids = codec.encode(BLOCKS[start:])
    stats = replay(proposer, codec.encode(EDIT_PROMPT), output_ids, max_draft)
    drafted = [step for step in stats.steps if step.draft_len]
    assert sum(step.accepted for step in drafted) >= len(output_ids) * max_draft // (max_draft + 1) - 4
    assert all(step.accepted == step.draft_len for step in drafted)  # never another block's text


def copy_lines_of_gamma(tokenizer):
    """An IndexLookup started on the gamma block that has copied all of that block's repeated lines
    but their last token (the line break before the mark line), its last step a fully accepted
    draft from there. Returns it, the prompt, the whole output and how many output tokens are done."""
    codec = TokenBytes(tokenizer)
    start = BLOCKS.index(block("gamma"))
    proposer = IndexLookup(one_document(tokenizer, BLOCKS), uri="doc.py", cursor=start)
    prompt_ids = codec.encode(EDIT_PROMPT)
    output_ids = codec.encode(BLOCKS[start:])
    lines = cut_after(codec, BLOCKS[start:], len(LINES))  # ends with the "\n   " before " mark"
    stats = replay(proposer, prompt_ids, lines[:-1], 16)
    return proposer, prompt_ids, output_ids, len(lines) - 1, stats


def test_repeated_blocks_the_draft_names_the_right_mark_and_the_cursor_follows(tokenizer):
    codec = TokenBytes(tokenizer)
    proposer, prompt_ids, output_ids, done, stats = copy_lines_of_gamma(tokenizer)
    last = stats.steps[-1]
    assert last.proposer == "index" and last.accepted == last.draft_len >= 8
    draft = proposer.propose(ProposeContext([*prompt_ids, *output_ids[:done]], len(prompt_ids), 16))
    assert draft.match.source == "doc.py"
    assert draft.token_ids == tuple(output_ids[done : done + 16])  # "\n    mark('gamma')\n..."
    assert codec.join(draft.token_ids).startswith(b"\n    mark('gamma')")
    # The draft continues the gamma block at its last line break, and the locality cursor is there.
    gamma_break = BLOCKS.index(block("gamma")) + len(LINES) - 1
    assert draft.match.position == proposer.index.token_offset("doc.py", gamma_break)
    assert abs(proposer.cursor - draft.match.position) <= 2


def test_repeated_blocks_keep_the_occurrence_after_a_step_without_an_index_draft(tokenizer):
    codec = TokenBytes(tokenizer)
    proposer, prompt_ids, output_ids, done, _ = copy_lines_of_gamma(tokenizer)
    # One plain step (auto decided nothing pays, or chose another proposer whose first token was
    # rejected): one token out, no draft of the index's. The copying goes on from the gamma block.
    sequence = [*prompt_ids, *output_ids[: done + 1]]
    proposer.observe(Outcome(EMPTY_DRAFT, 0, (output_ids[done],), len(sequence)))
    draft = proposer.propose(ProposeContext(sequence, len(prompt_ids), 16))
    assert codec.join(draft.token_ids).startswith(b" mark('gamma')")


@pytest.mark.parametrize("per_step", [1, 3, 6])
def test_the_cursor_follows_text_another_proposer_copied(tokenizer, per_step):
    """Under auto another proposer (the copy pointer) often wins while the output copies this
    document: the index drafted too (every lookup drafts every step), and where the emitted
    tokens follow its own draft's place, the cursor follows, so among repeated blocks the next
    draft is still from the block being copied."""
    codec = TokenBytes(tokenizer)
    start = BLOCKS.index(block("gamma"))
    proposer = IndexLookup(one_document(tokenizer, BLOCKS), uri="doc.py", cursor=start)
    prompt_ids = codec.encode(EDIT_PROMPT)
    lines = cut_after(codec, BLOCKS[start:], len(LINES))[:-1]  # gamma's repeated lines, less the last token
    proposer.begin(prompt_ids)
    done = 0
    while done < len(lines):
        sequence = [*prompt_ids, *lines[:done]]
        proposer.propose(ProposeContext(sequence, len(prompt_ids), 16))  # its own draft, not verified
        emitted = tuple(lines[done : done + per_step])
        other = Draft(emitted[:-1], "reference", match=MatchInfo(5, "reference", 0))
        proposer.observe(Outcome(other, len(emitted) - 1, emitted, len(sequence) + len(emitted)))
        done += len(emitted)
    draft = proposer.propose(ProposeContext([*prompt_ids, *lines], len(prompt_ids), 16))
    assert codec.join(draft.token_ids).startswith(b"\n    mark('gamma')")


def test_insertion_inside_a_repeated_block_resumes_on_that_block(tokenizer):
    """The output copies the document from the top and inserts a comment inside the gamma block,
    between its repeated lines and its mark: after the comment the proposer must find the text
    again, and on the gamma block, not on the first block whose lines match."""
    codec = TokenBytes(tokenizer)
    at = BLOCKS.index(block("gamma")) + len(LINES)
    inserted = "    # counted twice on purpose\n"
    output = BLOCKS[:at] + inserted + BLOCKS[at:]
    output_ids = codec.encode(output)
    prompt_ids = codec.encode(EDIT_PROMPT)
    stats = replay(IndexLookup(one_document(tokenizer, BLOCKS), uri="doc.py", cursor=0), prompt_ids, output_ids, 64)
    # Up to the insertion in a few long drafts, the inserted tokens at most one forward each, then
    # the rest of the document in a few long drafts again.
    assert len(stats.steps) <= len(codec.encode(inserted)) + 10
    assert len(stats.steps) * 3 < len(output_ids)
    # Once the first word after the comment is out, the draft is the rest of the gamma block.
    proposer = IndexLookup(one_document(tokenizer, BLOCKS), uri="doc.py", cursor=0)
    emitted = cut_after(codec, output, len(BLOCKS[:at] + inserted) + len("    mark"))
    draft = step_to(proposer, prompt_ids, emitted, 32)
    assert len(draft) == 32
    assert output.encode().startswith(codec.join(emitted) + codec.join(draft.token_ids))


def test_insertion_the_proposer_finds_its_way_back(tokenizer):
    codec = TokenBytes(tokenizer)
    old = "def f(x):\n    y = x * 2\n    return y\n\n\ndef g(y):\n    return y\n"
    output = "def f(x):\n    y = x * 2\n    y = y + 1\n    return y\n\n\ndef g(y):\n    return y\n"
    prompt_ids = codec.encode(EDIT_PROMPT)
    stats = replay(
        IndexLookup(one_document(tokenizer, old, "old.py"), uri="old.py", cursor=0),
        prompt_ids,
        codec.encode(output),
        64,
    )
    inserted = len(codec.encode("    y = y + 1\n"))
    assert len(stats.steps) <= inserted + 4
    assert stats.steps[-1].accepted == stats.steps[-1].draft_len > 0  # the tail in one draft
    # One word of the old text after the inserted line is enough to find the place again.
    emitted = cut_after(codec, output, output.index(" return y") + len(" return"))
    draft = step_to(IndexLookup(one_document(tokenizer, old, "old.py"), uri="old.py", cursor=0), prompt_ids, emitted)
    assert codec.join(emitted) + codec.join(draft.token_ids) == output.encode()


def test_deletion_skips_the_deleted_text(tokenizer):
    codec = TokenBytes(tokenizer)
    old = "import os\nimport sys\nimport json\n\n\ndef main():\n    print(os.getcwd())\n"
    output = "import os\nimport json\n\n\ndef main():\n    print(os.getcwd())\n"
    prompt_ids = codec.encode(EDIT_PROMPT)
    proposer = IndexLookup(one_document(tokenizer, old, "old.py"), uri="old.py", cursor=0)
    draft = step_to(proposer, prompt_ids, codec.encode("import os\nimport json"))
    assert codec.join(draft.token_ids) == b"\n\n\ndef main():\n    print(os.getcwd())\n"
    assert draft.match.source == "old.py"
    stats = replay(
        IndexLookup(one_document(tokenizer, old, "old.py"), uri="old.py", cursor=0),
        prompt_ids,
        codec.encode(output),
        64,
    )
    assert len(stats.steps) <= 4


@pytest.mark.parametrize("word", ["transport", "timeout", "raise_for"])
def test_output_split_at_other_token_boundaries_is_picked_up_again(tokenizer, word):
    """The index matches token ids, so an output that splits a word differently from the indexed
    document (here: the text cut in two inside ``word`` and each half tokenized alone) cannot be
    drafted across the odd tokens. As soon as the last ``min_other_match`` output tokens sit on the
    document's own token boundaries again (it is not the request's document), the draft is the rest
    of the document."""
    codec = TokenBytes(tokenizer)
    workspace = one_document(tokenizer, CLIENT, "client.py")
    split = CLIENT.index(word) + 3
    output_ids = codec.encode(CLIENT[:split]) + codec.encode(CLIENT[split:])

    def placed(ids):
        offsets = [0]
        for token_id in ids:
            offsets.append(offsets[-1] + len(codec.token(token_id)))
        return list(zip(offsets, ids))

    document = set(placed(codec.encode(CLIENT)))
    output = placed(output_ids)
    foreign = [n for n, token in enumerate(output) if token not in document]
    need = IndexLookup(workspace).min_other_match
    back = next(
        n
        for n in range(max(foreign, default=0) + need, len(output))
        if all(token in document for token in output[n - need : n])
    )  # min_other_match tokens in step
    prompt_ids = codec.encode("# client\n")
    draft = step_to(IndexLookup(workspace), prompt_ids, output_ids[:back], 16)
    offset = output[back][0]
    assert draft.match.source == "client.py"
    assert codec.join(draft.token_ids) == CLIENT.encode()[offset : offset + len(codec.join(draft.token_ids))]
    assert len(draft) == 16
    # Over the whole output: the odd tokens and the few after them cost a forward each, the rest is
    # copied in full drafts.
    stats = replay(IndexLookup(workspace), prompt_ids, output_ids, 8)
    assert len(stats.steps) <= -(-len(output_ids) // 9) + len(foreign) + 5


def test_a_two_token_match_drafts_from_the_current_document_but_not_from_another(tokenizer):
    """Two tokens that also occur in another file say little about what follows here: such a match
    drafts only from the current document (or with ``min_other_match`` lowered to 2)."""
    codec = TokenBytes(tokenizer)
    client_ids = list(codec.encode(CLIENT))
    outsider = next(t for t in range(len(tokenizer)) if t not in client_ids and t > 10)
    position = len(client_ids) // 2  # a pair in the middle of the document, preceded by a token
    context_ids = [outsider, *client_ids[position : position + 2]]

    def draft_for(min_other_match: int, uri: str | None, documents: dict[str, str]):
        workspace = WorkspaceIndex(tokenizer)
        for name, text in documents.items():
            workspace.add_document(name, text, 1)
        assert workspace.lookup(context_ids, 8)[0].match_len == 2  # the setting this test is about
        proposer = IndexLookup(workspace, uri=uri, use_context=False, min_other_match=min_other_match)
        proposer.begin(context_ids)
        return proposer.propose(ProposeContext(context_ids, len(context_ids), 8))

    assert draft_for(3, "current.py", {"client.py": CLIENT, "current.py": "x = 1\n"}) == EMPTY_DRAFT
    assert draft_for(2, "current.py", {"client.py": CLIENT, "current.py": "x = 1\n"}).match.source == "client.py"
    same = draft_for(3, "client.py", {"client.py": CLIENT})
    assert same.match.source == "client.py" and same.token_ids == tuple(client_ids[position + 2 : position + 10])
    setup = ProposerSetup.from_options(None, {"index": WorkspaceIndex(tokenizer), "min_other_match": "4"})
    assert create_proposer("index", setup).min_other_match == 4
    # auto prices drafts by match length itself: its index proposer sees every match unless told
    from codespec.proposers.auto import build_auto

    def auto_index(options):
        auto = build_auto(ProposerSetup.from_options(None, {"index": WorkspaceIndex(tokenizer), **options}))
        return next(sub.proposer for sub in auto.subs if sub.name == "index")

    assert auto_index({}).min_other_match == 1 and auto_index({"min_other_match": 5}).min_other_match == 5


def test_under_auto_the_index_asks_the_requests_own_text_only_where_no_context_lookup_does(tokenizer):
    """auto's context lookup asks the request's own text, so its index lookup does not ask it again;
    an auto restricted to the index (no context lookup) keeps it in the index's drafts."""
    import dataclasses

    from codespec.core.target import TokenizerTarget
    from codespec.proposers.setup import RequestContext

    request = RequestContext(index=WorkspaceIndex(tokenizer))
    for candidates, asked in (("context,index", False), ("index", True)):
        setup = ProposerSetup.from_options(TokenizerTarget(tokenizer), {"auto_candidates": candidates})
        auto = create_proposer("auto", dataclasses.replace(setup, request=request))
        index = auto._sub("index").proposer
        assert (index.context is not None) is asked, candidates
