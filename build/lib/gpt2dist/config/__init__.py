"""What a run is, before torch loads: the params.yaml schema (schema), the presets and their one front
door (presets), the strategies' torch-free descriptions (strategies), model sizes (sizes) and the GPUs a
study is planned for (planning). Every rank receives a fully resolved RunSpec built from these."""
