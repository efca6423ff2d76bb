"""What the doors share and the engine never needs: the token and Origin check, logging that never
quotes a client's input whole, and reading a broken JSON-RPC message's id.
"""
