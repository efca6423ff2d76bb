"""The proposer names `codespec simulate` knows (a module of its own so `--help` stays light)."""

from codespec.proposers.registry import LOOKUP, MODEL, proposer_names

BASELINE = "hf-rule"
# next-edit drafts from the user's recent edits, which only the next-edit workload records
# (bench/next_edit.py); the shared workloads' cases have none.
LOOKUP_PROPOSERS = tuple(name for name in proposer_names(LOOKUP) if name != "next-edit")
MODEL_PROPOSERS = proposer_names(MODEL)
