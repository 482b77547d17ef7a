"""cel-numpy: capability enhancement localization in pure NumPy.

    import cel_numpy as cn
    model = cn.load_model("smollm2")   # or a Hugging Face folder, a .gguf file, a .npz export

`import cel_numpy` stays cheap: the model code is imported on first use.
"""


def load_model(source, *, dtype="float32"):
    """Load a Model from a known name ("smollm2"), a HF folder, a .gguf or a .npz export.

    dtype: "float32" (default, inference) or "float64". See cel_numpy.models.model.Model.
    """
    from cel_numpy.models.loaders import load_model as _load_model

    return _load_model(source, dtype=dtype)


__all__ = ["load_model"]
