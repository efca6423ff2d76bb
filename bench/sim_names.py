"""The proposer names `codespec simulate` knows (a module of its own so `--help` stays light)."""

from proposers.registry import LOOKUP, MODEL, proposer_names

BASELINE = "hf-rule"
LOOKUP_PROPOSERS = proposer_names(LOOKUP)
MODEL_PROPOSERS = proposer_names(MODEL)
