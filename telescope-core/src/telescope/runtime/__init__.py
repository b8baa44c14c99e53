"""Ray and process plumbing: ``telescope run``'s launch, the Ray cluster and placement, worker actors, server processes, ``telescope eval``."""
