"""Write tests/fixtures/smollm2_benchmark_logliks.json: SmolLM2's choice log-likelihoods on real
HellaSwag and BoolQ items, by transformers reading the same GGUF file.

An independent check of the whole path (data conversion -> prompt -> tokenization -> forward ->
choice scoring): for the first 4 validation items of each task (the converted task files of
`cel-numpy fetch hellaswag | boolq`), each choice is tokenized as the paper's released code does
(context = encode(prompt); continuation = encode(prompt + " " + choice)[len(context):]) with the
GGUF's tokenizer in transformers, and its total log-probability computed in float32.

    /work/venv-ref/bin/python scripts/write_benchmark_fixture.py

Needs the cached files (~/.cache/cel-numpy/{smollm2,hellaswag,boolq}, or $CEL_NUMPY_CACHE).
"""

import json
import os
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("CEL_NUMPY_CACHE", Path.home() / ".cache" / "cel-numpy"))
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_ITEMS = 4


def items(name: str) -> list[dict]:
    lines = (CACHE / name / f"{name}-validation.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return [r for r in rows if "options" not in r][:N_ITEMS]


def main() -> None:
    folder = CACHE / "smollm2"
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
    model.eval()
    out = {"written_by": "scripts/write_benchmark_fixture.py", "torch": torch.__version__,
           "transformers": transformers.__version__, "tasks": {}}  # fmt: skip
    for name in ("hellaswag", "boolq"):
        rows = []
        for item in items(name):
            context = tok.encode(item["prompt"], add_special_tokens=True)
            logliks, ids = [], []
            for choice in item["choices"]:
                whole = tok.encode(item["prompt"] + " " + choice, add_special_tokens=True)
                cont = whole[len(context) :]
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([context + cont])).logits[0]
                logp = torch.log_softmax(logits.double(), dim=-1)
                n = len(context)
                logliks.append(float(logp[n - 1 : n - 1 + len(cont)].gather(
                    1, torch.tensor(cont)[:, None]).sum()))  # fmt: skip
                ids.append(cont)
            rows.append({"id": item["id"], "context_ids": context, "continuation_ids": ids,
                         "loglik": logliks})  # fmt: skip
        out["tasks"][name] = rows
    path = REPO / "tests" / "fixtures" / "smollm2_benchmark_logliks.json"
    path.write_text(json.dumps(out) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
