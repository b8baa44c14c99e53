"""The embedded inference engine (torch + transformers, CPU or GPU) and its HTTP server."""
