"""Errors a user can act on. Each message says what was wrong and what was looked for."""


class CodespecError(Exception):
    """Base class: anything codespec raises on purpose."""


class ModelNotFoundError(CodespecError):
    """No model at the given path and none cached under the given id (no download is attempted)."""


class InvalidRequestError(CodespecError, ValueError):
    """A request that cannot be served as given (empty prompt, bad sampling values, too long)."""


class ContextLengthError(InvalidRequestError):
    """A prompt (with room for its output) that does not fit the model's context or KV memory."""


class ServiceClosedError(CodespecError):
    """The engine service is closed (the server is stopping): the request was not run."""
