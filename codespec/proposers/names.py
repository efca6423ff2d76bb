"""The one list of proposer names and their kinds, importing nothing: read by the CLI's help, the
request schema and ``proposers.models`` without loading a proposer."""

from __future__ import annotations

LOOKUP, MODEL, POLICY = "lookup", "model", "policy"  # built per request; long-lived; picks among them

# name -> kind
PROPOSERS: dict[str, str] = {
    "context": LOOKUP,
    "reference": LOOKUP,
    "index": LOOKUP,
    "next-edit": LOOKUP,
    "draft": MODEL,
    "early-exit": MODEL,
    "auto": POLICY,
}


def proposer_names(kind: str) -> tuple[str, ...]:
    """The proposers of one kind (``LOOKUP``, ``MODEL``, ``POLICY``), in table order."""
    return tuple(name for name, of_kind in PROPOSERS.items() if of_kind == kind)
