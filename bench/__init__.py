"""`codespec bench`: codespec's configurations side by side with transformers' speculative modes.

Modules: ``cli`` (arguments, profiles), ``workload`` (records -> bench cases), ``models`` (target,
tokenizer, draft), ``replay`` (the replay-mode logit bias), ``engine`` (codespec configurations),
``peers`` (transformers hf-* configurations), ``run`` (interleaving, metrics), ``load`` (offered
load through the websocket server), ``report`` (markdown and plots).
"""
