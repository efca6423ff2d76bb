"""Drafters behind codespec's proposer protocol (codespec.core.draft). Registered as entry points."""
