"""cel-numpy: capability enhancement localization in pure NumPy.

    import cel_numpy as cn
    model = cn.load_model("smollm2")   # or a Hugging Face folder, a .gguf file, a .npz export

`import cel_numpy` stays cheap: the model code is imported on first use.
"""

from pathlib import Path


def load_model(source, *, dtype="float32", weight_cache=None):
    """Load a Model from a known name ("smollm2"), a HF folder, a .gguf or a .npz export.

    dtype: "float32" (default, inference) or "float64". See cel_numpy.models.model.Model.
    weight_cache: None (default: float32 GGUF models are mapped read-only from the cache,
    shared by every process), True or False; see cel_numpy.models.weight_cache.
    """
    from cel_numpy.models.loaders import load_model as _load_model

    return _load_model(source, dtype=dtype, weight_cache=weight_cache)


def fixtures_dir() -> Path:
    """The folder of the tiny random models that ship inside the package, for tutorials.

    fixtures_dir() / "tiny_gpt2" (2 layers, 4 heads, vocabulary 96) and "tiny_llama" (2 layers,
    4 query heads sharing 2 key/value heads): Hugging Face folders (config.json +
    model.safetensors), byte-identical to the test fixtures of the same names. Found from the
    installed package, so a tutorial or notebook runs from any working directory.
    """
    return Path(__file__).resolve().parent / "fixtures"


__all__ = ["fixtures_dir", "load_model"]
