"""Errors users can act on. Each carries a one-line message fit for a CLI or an HTTP 4xx."""


class SpecServeError(Exception):
    """Base class: a problem with the request or set-up, not a bug."""


class ModelLoadError(SpecServeError):
    """A model spec could not be resolved or loaded (unknown path, wrong kind of model, ...)."""


class ContextLengthError(SpecServeError, ValueError):
    """The prompt (or prompt + prediction) does not fit the model's context window."""


class InvalidRequestError(SpecServeError, ValueError):
    """Request fields that are individually valid but cannot be served together. param: the
    request field to blame, when one is (the server names it in its 400)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param
