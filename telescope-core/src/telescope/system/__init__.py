"""The ground floor's host-level helpers, shared by the servers and the launcher.

The run token's check (``access``), addresses and sockets (``addressing``), devices
(``devices``), server processes (``processes``), the event loop (``event_loop``), the
timeline event bus every component emits on (``events``; the run store is one sink) and
the start-up objects' garbage collection (``garbage_collection``). Below
``inference/``, ``transports/``, ``recording/`` and ``runtime/`` (which launches the
servers): nothing here imports from them.
"""
