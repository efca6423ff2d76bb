"""The proposer names `codespec simulate` knows (a module of its own so `--help` stays light)."""

BASELINE = "hf-rule"
LOOKUP_PROPOSERS = ("context", "reference", "index")
MODEL_PROPOSERS = ("draft", "early-exit")
