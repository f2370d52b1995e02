"""docs/config.md's key tables are the key registry's (core/base/config_registry.h), as
`parallax config --markdown` prints them: a key added, removed or changed in the code without
running scripts/config_docs.sh fails here, naming it."""
import os
import re
import subprocess
from pathlib import Path

import pytest

EXE = os.environ.get("PARALLAX_EXE")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "config.md"
BEGIN = "<!-- keys: made by scripts/config_docs.sh -->"
END = "<!-- keys: end -->"


def parallax(*args):
    r = subprocess.run([EXE, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def page_tables():
    text = PAGE.read_text()
    assert BEGIN in text and END in text, f"{PAGE} lacks its marker lines"
    return text[text.index(BEGIN) + len(BEGIN) + 1:text.index(END)]


def rows(markdown):
    """{"model.vocab": "| `vocab` | int ≥ 2 | 32 | ... |"} from the tables."""
    out, section = {}, None
    for line in markdown.splitlines():
        m = re.match(r"### `\[(\w+)\]`", line)
        if m:
            section = m.group(1)
        elif section and line.startswith("| `"):
            name = re.match(r"\| `(\w+)`", line).group(1)
            out[f"{section}.{name}"] = line
    return out


def test_every_key_of_the_registry_has_its_row_and_no_row_is_stale():
    keys = [line.split("\t")[0] for line in parallax("config", "--keys").splitlines()]
    assert len(keys) > 100 and len(set(keys)) == len(keys)
    want, got = rows(parallax("config", "--markdown")), rows(page_tables())
    assert list(want) == keys
    missing = [k for k in keys if k not in got]
    stale = [k for k in got if k not in want]
    changed = [k for k in keys if k in got and got[k] != want[k]]
    fix = "run scripts/config_docs.sh"
    assert not missing, f"keys without a row in docs/config.md: {missing} ({fix})"
    assert not stale, f"rows of docs/config.md for keys that do not exist: {stale} ({fix})"
    assert not changed, f"rows of docs/config.md that differ from the registry: {changed} ({fix})"
    assert page_tables() == parallax("config", "--markdown"), fix


def test_the_default_job_printed_is_the_embedded_default():
    text = parallax("config")
    for key in ("vocab", "seq_len", "min_history", "replica_check_every"):
        assert re.search(rf"^{key} = ", text, re.M), key
    # Every key appears once, with a comment saying what it means above it.
    lines = text.splitlines()
    for line in parallax("config", "--keys").splitlines():
        name = line.split("\t")[0].split(".")[1]
        at = [i for i, l in enumerate(lines) if l.startswith(f"{name} = ")]
        assert at and all(lines[i - 1].startswith("# ") for i in at), name
