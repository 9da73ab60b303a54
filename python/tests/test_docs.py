"""The Python examples of README.md and docs/python.md run as written."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("doc", ["README.md", "docs/python.md"])
def test_python_examples_run(doc):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), flags=re.S)
    assert blocks, f"no Python example in {doc}"
    for code in blocks:
        exec(compile(code, doc, "exec"), {})
