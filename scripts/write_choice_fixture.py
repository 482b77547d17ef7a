"""Write tests/fixtures/choice_loglik_reference.json: choice log-likelihoods by transformers.

The independent reference for the choice engine (`cel_numpy.models.fast.score_continuations`,
HellaSwag's multi-token endings): on each tiny fixture model (the committed folders written by
scripts/write_fixtures.py), three random contexts, each with four random continuations of 1-6
tokens, and for every (context, continuation) the total log-probability of the continuation
after the context, each sequence run alone, in float64, under three conditions: intact, head
(1, 2) zeroed, heads (0, 1) and (1, H - 1) zeroed (the o_proj pre-hook of write_fixtures.py).

    /work/venv-ref/bin/python scripts/write_choice_fixture.py

Deterministic (torch.manual_seed per model); torch 2.13.0, transformers 5.x.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from write_fixtures import (
    FIXTURES,
    MODELS,
    VOCAB,
    float64_numerics,
    heads_and_dhead,
    zero_heads,
)

CONTEXT_LENGTHS = (9, 6, 12)
N_CHOICES = 4


def loglik(model, context: list[int], continuation: list[int]) -> float:
    """Total log p(continuation | context), the sequence run alone (positions 0..n-1)."""
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
    logp = torch.log_softmax(logits[0].double(), dim=-1)  # (n, V)
    n, A = len(context), len(continuation)
    rows = logp[n - 1 : n - 1 + A]  # (A, V) each predicts one continuation token
    return float(rows[torch.arange(A), torch.tensor(continuation)].sum())


def model_reference(name: str, seed: int) -> dict:
    model_cls, _, _, o_proj_path = MODELS[name]
    model = model_cls.from_pretrained(
        FIXTURES / name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model = model.double()
    H, _ = heads_and_dhead(model)
    torch.manual_seed(seed)
    contexts = [torch.randint(1, VOCAB, (n,)).tolist() for n in CONTEXT_LENGTHS]
    continuations, parent = [], []
    for b in range(len(contexts)):
        for _ in range(N_CHOICES):
            A = int(torch.randint(1, 7, ()))
            continuations.append(torch.randint(1, VOCAB, (A,)).tolist())
            parent.append(b)
    conditions = [[], [[1, 2]], [[0, 1], [1, H - 1]]]
    values = []
    with float64_numerics(model):
        for cond in conditions:
            with zero_heads(model, o_proj_path, cond):
                values.append(
                    [loglik(model, contexts[b], c) for b, c in zip(parent, continuations)]
                )
    assert not np.allclose(values[0], values[1]), f"{name}: the ablation changed nothing"
    return {
        "contexts": contexts,
        "continuations": continuations,
        "parent": parent,
        "conditions": conditions,
        "loglik": values,
    }


def main() -> None:
    torch.use_deterministic_algorithms(True)
    out = {
        "written_by": "scripts/write_choice_fixture.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "models": {
            name: model_reference(name, seed)
            for seed, name in enumerate(("tiny_gpt2", "tiny_llama", "tiny_qwen2"), 11)
        },
    }
    path = FIXTURES / "choice_loglik_reference.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
