"""The trainer side: sequence packing, the FSDP backend, checkpoints."""
