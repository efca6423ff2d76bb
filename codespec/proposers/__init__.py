"""Drafters behind codespec's proposer protocol (codespec.draft). Registered as entry points."""
