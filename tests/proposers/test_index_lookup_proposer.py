"""Index lookup over a real WorkspaceIndex: sources, tie-breaking, outcome statistics, equivalence."""

from __future__ import annotations

import json
import os
import sysconfig

import pytest

from codespec.draft import Outcome, ProposeContext
from codespec.registry import ProposerSetup, create_proposer
from index import WorkspaceIndex
from proposers.index_lookup import IndexLookup
from proposers.lookup_sim import replay
from proposers.token_bytes import TokenBytes

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
    from codespec.shapes import build_tokenizer

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
    proposer = create_proposer("index", ProposerSetup(None, {"index": workspace, "uri": "doc.py",
                                                             "cursor": len(prefix)}))
    context_ids = codec.encode(prefix)
    proposer.begin(context_ids)
    draft = proposer.propose(ProposeContext(context_ids, len(context_ids), 4))
    assert not codec.join(draft.token_ids).startswith(b"2)")  # the cursor's own continuation is skipped
    assert codec.join(draft.token_ids).startswith(b"1)")


def test_needs_an_index():
    with pytest.raises(ValueError, match="index"):
        create_proposer("index", ProposerSetup(None, {}))


def test_replay_of_a_copied_file_uses_long_drafts(index, tokenizer):
    codec = TokenBytes(tokenizer)
    output_ids = codec.encode(CLIENT)
    stats = replay(IndexLookup(index), codec.encode("# client\n"), output_ids, 32)
    # The first tokens have no match yet; from then on the document is copied in long drafts.
    assert len(stats.steps) <= 8
    assert index.source_stats("client.py")[1] >= len(output_ids) - 10


def test_greedy_output_is_identical_with_index_lookup(tmp_path):
    from codespec.config import GenerationLimits
    from codespec.decode import generate_all
    from codespec.model import TargetModel
    from codespec.shapes import save_random_model

    target = TargetModel.load(str(save_random_model(tmp_path / "tiny", _corpus(), "tiny", vocab_size=512, seed=5,
                                                    init_std=0.2)), device="cpu", dtype="float32")
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
    from codespec.cli import main

    tokenizer.save_pretrained(tmp_path / "tok")
    workspace = tmp_path / "ws.jsonl"
    workspace.write_text(json.dumps({"path": "client.py", "text": CLIENT}) + "\n")
    cases = [{"id": f"c{n}", "path": "app.py", "prefix": f"def call_{n}(self, request):\n"
              "        response = self.transport.handle(request)\n", "suffix": "\n", "target":
              "        response.raise_for_status()\n        return response\n"} for n in range(3)]
    workload = tmp_path / "completions.jsonl"
    workload.write_text("".join(json.dumps(c) + "\n" for c in cases))
    out = tmp_path / "report.json"
    assert main(["simulate", "--workload", str(workload), "--workspace", str(workspace), "--tokenizer",
                 str(tmp_path / "tok"), "--proposer", "index", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["proposers"]
    assert rows["index"]["tokens_per_forward"] > 2 * rows["hf-rule"]["tokens_per_forward"]
