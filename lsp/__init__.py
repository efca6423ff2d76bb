"""Editor-facing servers (LSP, websocket) that wire the engine, the index and the proposers."""
