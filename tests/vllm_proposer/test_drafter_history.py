"""BatchDrafter and what earlier sequences wrote: the session history of a workspace index and
the drafter's own store of outputs, drafted from by later sequences (as vLLM's ``suffix`` drafts
from its earlier responses)."""

import numpy as np
from transformers import AutoTokenizer

from codespec.core.default_model import target_path
from codespec.vllm_proposer.drafter import BatchDrafter
from codespec.vllm_proposer.options import DrafterOptions
from codespec.vllm_proposer.rows import Row
from tests.vllm_proposer.test_drafter import CompletionEngine


def test_what_a_sequence_generated_drafts_for_later_ones_through_the_session_history():
    """With an index, a sequence's output goes into its session history when its row leaves the
    batch (as codespec's engine records each request's output); a later request drafts from it."""
    from codespec.index import WorkspaceIndex

    tokenizer = AutoTokenizer.from_pretrained(target_path())
    index = WorkspaceIndex(tokenizer)
    drafter = BatchDrafter(tokenizer, 16, 4096, DrafterOptions(proposer="index"), index=index)
    answer = "totals = summarize_invoices(records, include_tax=True, currency='EUR', rounding=2)\n"
    accepted = []
    for prompt in ("# the first request\n", "# a later request\n"):
        engine = CompletionEngine(tokenizer, prompt, answer)
        before = drafter.stats.accepted
        while not engine.done:
            (draft,) = drafter.step([engine.row()])
            engine.verify(draft)
        drafter.step([])  # the next step: its row has left the batch
        accepted.append(drafter.stats.accepted - before)
    recorded = [(entry.kind, tokenizer.decode(entry.token_ids)) for entry in index.history_entries()]
    # the tokens sampled at a request's last step never reach a proposer (its row is gone by then)
    assert len(recorded) == 2 and all(kind == "generated" and answer.startswith(text) for kind, text in recorded)
    assert all(len(text) > len(answer) // 2 for _, text in recorded), recorded
    assert drafter.stats.recorded == 2
    assert accepted[0] == 0 and accepted[1] >= len(tokenizer.encode(answer)) - 8, accepted  # all but its start, end
    index.close()


def test_the_history_keeps_the_ids_the_model_generated_not_its_text_encoded_again():
    """A model may spell text otherwise than its tokenizer would (here one token a character):
    the history keeps its ids, which its later outputs repeat, and spares encoding the text."""
    from codespec.index import WorkspaceIndex

    tokenizer = AutoTokenizer.from_pretrained(target_path())
    index = WorkspaceIndex(tokenizer)
    drafter = BatchDrafter(tokenizer, 4, 4096, DrafterOptions(proposer="index"), index=index)
    answer = "totals = summarize(records)\n"
    engine = CompletionEngine(tokenizer, "# the request\n", answer)
    spelled = [token for character in answer for token in tokenizer.encode(character)]
    assert spelled != tokenizer.encode(answer)
    engine.answer = spelled
    engine.tokens[-1] = spelled[0]
    while not engine.done:
        (draft,) = drafter.step([engine.row()])
        engine.verify(draft)
    drafter.step([])
    (entry,) = index.history_entries()
    assert entry.token_ids == tuple(spelled[: len(entry.token_ids)]) and len(entry.token_ids) > len(spelled) // 2
    index.close()


def test_auto_drafts_later_sequences_from_what_earlier_ones_generated_without_an_index():
    """vLLM's ``suffix`` drafts from its earlier responses; auto does too, from the drafter's own
    store of outputs (``proposers.outputs``), with no workspace index configured."""
    tokenizer = AutoTokenizer.from_pretrained(target_path())
    now = [0.0]
    drafter = BatchDrafter(tokenizer, 16, 4096, clock=lambda: now[0])  # auto, the default; no index
    assert drafter.index is None
    answer = "totals = summarize_invoices(records, include_tax=True, currency='EUR', rounding=2)\n"
    accepted = []
    for prompt in ("# the first request\n", "# a later request\n", "# one more\n"):
        engine = CompletionEngine(tokenizer, prompt, answer)
        before = drafter.stats.accepted
        while not engine.done:
            (draft,) = drafter.step([engine.row()])
            now[0] += 0.002 + 0.0001 * (len(draft) + 1)  # a CPU step: drafts cost little
            engine.verify(draft)
        drafter.step([])  # the next step: its row has left the batch
        accepted.append(drafter.stats.accepted - before)
    assert len(drafter.outputs) == 3 and drafter.stats.recorded == 0  # the store, not an index's history
    # (a draft needs two tokens matched, and auto starts a new source's drafts short)
    assert accepted[0] == 0 and min(accepted[1:]) >= len(tokenizer.encode(answer)) // 2, accepted


def test_a_follow_up_turn_records_each_answer_apart_and_nothing_past_the_end():
    """A chat's next turn extends the previous one's sequence (prompt, answer, new message): the
    drafter follows it as the same sequence, and each answer is its own history entry, cut at the
    first special token (tokens vLLM accepted past the end of an answer are not output)."""
    from codespec.index import WorkspaceIndex

    tokenizer = AutoTokenizer.from_pretrained(target_path())
    index = WorkspaceIndex(tokenizer)
    drafter = BatchDrafter(tokenizer, 4, 4096, DrafterOptions(proposer="index"), index=index)
    first, second = "totals = summarize(records)\n", "average = mean(totals)\n"
    sequence = tokenizer.encode("# turn one: the totals\n")
    for answer, then in ((first, "# turn two: the average\n"), (second, "")):
        tokens = tokenizer.encode(answer) + [tokenizer.eos_token_id] + tokenizer.encode("junk = 1\n")
        for token in tokens:
            sequence = [*sequence, token]
            drafter.step([Row(np.array(sequence), 1)])
        sequence = [*sequence, *tokenizer.encode(then)]  # the next turn's prompt, with no step between
    drafter.step([])
    assert [tokenizer.decode(entry.token_ids) for entry in index.history_entries()] == [first, second]
    index.close()
