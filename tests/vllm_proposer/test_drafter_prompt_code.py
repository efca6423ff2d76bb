"""BatchDrafter and the code a prompt carries: found in every layout that has some, and a prompt
that cannot carry any is not decoded to find out."""

import numpy as np
from transformers import AutoTokenizer

from codespec.core.default_model import target_path
from codespec.core.prompts import FORMATS
from codespec.vllm_proposer.drafter import BatchDrafter
from codespec.vllm_proposer.options import DrafterOptions
from codespec.vllm_proposer.rows import Row
from tests.vllm_proposer.test_drafter import SOURCES


def test_a_prompt_is_decoded_to_find_its_code_only_where_it_may_carry_some():
    """A prompt in each layout that carries code gets its copy pointer; a completion's prompt (no
    fence, no rewrite ending) is not decoded whole to find out: only its last few tokens are."""
    from codespec.vllm_proposer.drafter import PROMPT_END_TOKENS

    tokenizer = AutoTokenizer.from_pretrained(target_path())
    drafter = BatchDrafter(tokenizer, k=8, max_model_len=4096, options=DrafterOptions(proposer="reference"))
    decoded: list[int] = []
    plain_decode = drafter._decode
    drafter._decode = lambda ids, **options: decoded.append(len(ids)) or plain_decode(ids, **options)  # type: ignore[method-assign]
    source = SOURCES[0]
    for prompt in (
        FORMATS["qwen2.5-coder"].rewrite(source),  # the shipped model's rewrite layout
        f"# Original:\n{source}\n# Rewritten:\n",  # the layout without file separators
        f"Fix the bug in this:\n```python\n{source}```\n",  # a chat message with a fenced block
    ):
        drafter.step([Row(np.array(tokenizer.encode(prompt) + [220]), 1)])
    assert drafter.stats.with_code == 3
    decoded.clear()
    completion = tokenizer.encode(SOURCES[2] * 4)  # long, and no backtick in it
    drafter.step([Row(np.array(completion), 1)])
    assert drafter.stats.with_code == 3 and decoded and max(decoded) <= PROMPT_END_TOKENS < len(completion)
