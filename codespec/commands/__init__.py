"""The `codespec serve`, `complete` and `demo` commands: they wire the doors to one engine service."""
