"""src/hf_rope_defaults.inc is what scripts/hf_rope_defaults.py writes from the installed
transformers: the config classes' RoPE defaults that embrope's config.json reader fills in
(a field a config leaves out takes HF's class default). A transformers release that changes a
default, or adds a model type, fails here until the table is regenerated with it."""

import pathlib
import re
import subprocess
import sys

import pytest

transformers = pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLE = ROOT / "src" / "hf_rope_defaults.inc"


@pytest.mark.ci_required
def test_the_table_is_the_installed_transformers_defaults():
    header = TABLE.read_text().splitlines()[0]
    written_with = re.search(r"from transformers (\S+)'s config", header).group(1)
    if transformers.__version__.split(".")[:2] != written_with.split(".")[:2]:
        pytest.skip(f"the table was written from transformers {written_with}; "
                    f"{transformers.__version__} is installed (pyproject.toml pins the tests')")
    generated = subprocess.run([sys.executable, str(ROOT / "scripts" / "hf_rope_defaults.py")],
                               capture_output=True, text=True, check=True).stdout
    assert generated == TABLE.read_text(), (
        "src/hf_rope_defaults.inc differs from what scripts/hf_rope_defaults.py writes from "
        "the installed transformers: regenerate it")
