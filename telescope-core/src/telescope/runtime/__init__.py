"""Ray plumbing: what launches and supervises a run.

``telescope run``'s launch, the Ray cluster and placement, the worker actors and their
supervision, and ``telescope eval``'s servers. The host-level helpers they share with
the servers they launch (addresses, devices, processes, the event loop) are one floor
below, in :mod:`telescope.system`.
"""
