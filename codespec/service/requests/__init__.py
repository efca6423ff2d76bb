"""What a request is and how each kind is built: the values every door hands the engine
(``request.GenerationRequest``), their validation (``schema``), options, positions, the edit history,
and the builders of completions, rewrites and next edits. Plain functions and values: no thread, no
server; nothing here imports the engine.
"""
