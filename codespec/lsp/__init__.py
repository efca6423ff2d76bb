"""The LSP door: pygls over stdio or TCP, with a framing reader no input can make deaf or dead."""
