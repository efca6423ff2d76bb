"""The engine: one thread that owns the model, the scheduler that batches requests into forwards,
the jobs the doors wait on, what is kept between requests, and starting and stopping it all (a
local model, or a served engine behind ``--engine-url``).
"""
