"""codespec: a local completion backend built around lookup-drafted speculative decoding."""

__version__ = "0.1.0"
