"""A user's model as the trainer's policy: a local Hugging Face directory or a GGUF file
(:mod:`~comppo_core.rl.models.pretrained`, :mod:`~comppo_core.rl.models.gguf`), and LoRA
adapters (:mod:`~comppo_core.rl.models.lora`). The submodules import torch and transformers
only where they load a model."""
