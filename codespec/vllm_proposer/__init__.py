"""codespec's drafting inside vLLM: a proposer class vLLM loads by its dotted path
(``codespec vllm-config`` prints the ``speculative_config`` naming it; docs/vllm.md)."""
