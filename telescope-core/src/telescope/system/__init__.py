"""The ground floor's host-level helpers, shared by the servers and the launcher.

The run token's check (``access``), addresses and sockets (``addressing``), devices
(``devices``), server processes (``processes``), the event loop (``event_loop``) and
the start-up objects' garbage collection (``garbage_collection``). The timeline event
bus every component emits on is :mod:`telescope.api.events`, on the floor below. Below
``inference/``, ``transports/``, ``recording/`` and ``runtime/`` (which launches the
servers): nothing here imports from them.
"""
