"""Real language models (GPT-2, Llama, Qwen2 families) in NumPy: load, run, ablate, differentiate.

    import cel_numpy as cn
    model = cn.load_model("smollm2")     # cel_numpy.models.loaders.load_model

    config.py       ModelConfig: the numbers that fix a model's shape and family
    weights.py      the weight table: our names, each checkpoint format's names, shapes
    loaders.py      known names, Hugging Face folders, .npz exports -> Model
    gguf_loader.py  GGUF files (llama and qwen2 architectures) -> params, config, tokenizer
    tokenizer.py    byte-level BPE in pure Python
    chat.py         chat templates rendered as transformers renders them (sandboxed jinja)
    transformer.py  the reference forward (one config-driven function for every family)
    backward.py     its backward pass
    fast.py         the fast exact engine for ablation screens (docs/design.md#engine)
    model.py        Model: logits, named activations, ablations, generation, gradients
    fetch.py        pinned model and vocabulary files from PyPI wheels, into the cache
    cli.py          `cel-numpy fetch | inspect | generate`

Nothing is imported here: `import cel_numpy.models` stays cheap.
"""
