"""The inference side: the embedded engine, the vLLM backend and the shared client."""
