"""telescope-megatron: the ``megatron`` trainer backend (megatron-core GPT models with tensor parallelism).

Installed next to telescope-core it registers ``train_backend: megatron`` and the
``megatron_*`` settings through the ``telescope`` entry-point group
(:mod:`telescope_megatron.plugin`). Heavy imports (torch, megatron-core) happen in
:mod:`telescope_megatron.backend`, only when a run builds the backend.
"""
