"""The engine core: the Target contract, models, KV and rollback, verification, the step function, the
proposer protocol, prompts and stats. It imports nothing else of codespec."""
