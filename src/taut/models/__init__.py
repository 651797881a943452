"""The model layer, in the order its modules import each other:

- `policy`: the Policy (model + tokenizer, prompt and response encoding), device and precision,
  the LoRA wrapper's view of the weights;
- `testbed`, `gguf`, `lora`: the testbed's presets, GGUF files converted once into a cached
  folder, fresh and merged LoRA adapters;
- (`taut.checkpoint` saves and restores a policy's weights: all weight persistence is there)
- `loading`: any model a `model:` section names, and the policy a checkpoint resumes from;
- `export`: trained weights as a shippable adapter (`taut export`).

Import from the submodule: this package's own namespace is empty, so that `taut.checkpoint`
can sit between `policy` and `loading` without an import cycle.
"""
