"""Print how far our Gemma 3 270M logits are from transformers' (tests/fixtures/gemma3_golden.npz).

    PYTHONPATH=. python scripts/measure_gemma3_parity.py

The test (tests/test_gemma3_real.py) only asserts a bound; this prints the measured differences
quoted in docs/models.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import cel_numpy as cn

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gemma3_golden.npz"


def main() -> None:
    model = cn.load_model("gemma-3-270m")
    with np.load(GOLDEN) as z:
        golden = {k: z[k] for k in z.files}
    sample = golden["sample_ids"]
    n = sum(1 for k in golden if k.startswith("ids_"))
    for i in range(n):
        ids = golden[f"ids_{i}"].tolist()
        logits = model.next_token_logits([ids])[0].astype(np.float64)  # (V,)
        top = golden[f"top_ids_{i}"]
        top_err = np.abs(logits[top] - golden[f"top_logits_{i}"]).max()
        sample_err = np.abs(logits[sample] - golden[f"sample_logits_{i}"]).max()
        lse = np.log(np.exp(logits - logits.max()).sum()) + logits.max()
        print(
            f"prompt {i}: {len(ids)} ids, top-1 equal {int(np.argmax(logits)) == int(top[0])}, "
            f"max |diff| top-64 {top_err:.2e}, sampled 256 {sample_err:.2e}, "
            f"logsumexp {abs(lse - float(golden[f'logsumexp_{i}'])):.2e}"
        )


if __name__ == "__main__":
    main()
