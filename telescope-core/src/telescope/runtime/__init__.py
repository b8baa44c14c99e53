"""Ray and process plumbing.

``telescope run``'s launch, the Ray cluster and placement, the worker actors, the
inference server processes, and ``telescope eval``'s servers.
"""
