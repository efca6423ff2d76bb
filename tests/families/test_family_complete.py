"""`codespec complete FILE:LINE:COL --model DIR` per family: the format the product reports is the
family's, the prompt the engine rendered is that family's FIM layout (as its model card spells it,
written out here rather than read from codespec.core.prompts), its markers are single tokens, and the
speculative completion is identical to plain decoding."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest
from family_layouts import FAMILIES

from codespec.commands.cli import main
from codespec.core.prompts import Fim, PromptRenderer

pytestmark = pytest.mark.slow  # codespec complete per model family: `python -m pytest --full` runs it

SOURCE = (
    "import os\n\n\ndef square(x):\n    return x * x\n\n\ndef cube(x):\n    return x * x * x\n\n\n"
    "def quad(x):\n    \n\n\ndef main(argv):\n    return [quad(int(a)) for a in argv]\n"
)
LINE, COLUMN = 13, 5  # inside quad's body

# (BOS, start, hole, middle): prefix-suffix-middle order, from each family's model card.
LAYOUTS = {
    "qwen2.5-coder": ("", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    "starcoder2": ("", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    "deepseek-coder": ("<｜begin▁of▁sentence｜>", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
}


@pytest.mark.parametrize("name", FAMILIES)
def test_complete_renders_the_family_fim_layout(family_checkpoints, loaded, tmp_path, monkeypatch, name):
    family = family_checkpoints(name)
    source = tmp_path / "shapes.py"
    source.write_text(SOURCE, encoding="utf-8")
    rendered: list[str] = []
    render = PromptRenderer.render

    def spy(self, prompt):
        result = render(self, prompt)
        if isinstance(prompt, Fim):
            rendered.append(result.text)
        return result

    monkeypatch.setattr(PromptRenderer, "render", spy)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(
            [
                "complete",
                f"{source}:{LINE}:{COLUMN}",
                "--model",
                str(family.target),
                "--draft",
                str(family.draft),
                "--device",
                "cpu",
                "--workspace",
                str(tmp_path),
                "--max-tokens",
                "12",
                "--repeats",
                "1",
                "--json",
            ]
        )
    assert code == 0
    report = json.loads(out.getvalue().strip().splitlines()[-1])
    assert report["prompt_format"] == family.prompt_format
    assert report["identical_output"] is True
    assert report["speculative_tokens"] == report["plain_tokens"] > 0

    bos, start, hole, middle = LAYOUTS[family.prompt_format]
    pattern = f"{re.escape(bos + start)}(.*){re.escape(hole)}(.*){re.escape(middle)}"
    assert rendered and all(re.fullmatch(pattern, text, flags=re.DOTALL) for text in rendered), rendered
    layout = re.fullmatch(pattern, rendered[0], flags=re.DOTALL)
    assert layout is not None
    cursor = SOURCE.index("    \n\n\ndef main") + 4
    prefix, suffix = layout.groups()
    assert prefix and SOURCE[:cursor].endswith(prefix) and SOURCE[cursor:].startswith(suffix)
    # The markers (and the BOS) are single tokens of this tokenizer, in place, each once.
    target = loaded(family.target)
    vocab = target.tokenizer.get_vocab()
    ids = target.encode(rendered[0])
    markers = [vocab[m] for m in (bos, start, hole, middle) if m]
    assert [i for i in ids if i in markers] == markers
    assert ids[0] == markers[0]
