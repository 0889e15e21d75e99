"""Templates the repository has never seen (issue 36): other releases of supported families,
pulled from public repositories into tests/data/templates_unseen (PROVENANCE.tsv), none
byte-identical to a template of data/templates. Each is detected as a family or "derived"
(never "unknown"), and random calls it renders read back with no new family code: through the
dialect derived from it where it derives, else through the family module detection picks."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
from pathlib import Path

import pytest
from families import PROMPT
from hypothesis import given
from hypothesis import strategies as st
from test_derive import ROUND_TRIPS, TEMPLATE_VALUES, assert_derived_round_trip
from test_families import FAMILIES, assert_template_turn_reads_back

from pegmask.bench.data import TEMPLATES_DIR
from pegmask.dialects import DerivationError, detect_dialect, render_chat_template
from pegmask.dialects.probe import derive_format

UNSEEN_DIR = Path(__file__).parent / "data" / "templates_unseen"

# What detect_dialect picks for each unseen template (a family module, or "derived").
DETECTED = {
    "Apriel-1.6-15b-Thinker-fixed.jinja": "apriel",
    "ByteDance-Seed-OSS.antibyte-variant.jinja": "seed-oss",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.ye-NX-variant.jinja": "cohere",
    "Kimi-K2-Thinking.jinja": "kimi",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "Qwen3-Coder.antibyte-variant.jinja": "hermes-xml",
    "deepseek-ai-DeepSeek-V3.1.antibyte-variant.jinja": "deepseek-v3.1",
    "google-gemma-4-31B-it-interleaved.jinja": "gemma",
    "poolside-Laguna-XS-2.1.jinja": "glm",
}
# Those that do not derive, read back through the family module detection picks, as the
# release of the family that data/templates holds is (test_families.FAMILIES).
FAMILY_OF = {
    "Apriel-1.6-15b-Thinker-fixed.jinja": "apriel-1.5",
    "Kimi-K2-Thinking.jinja": "kimi-k2-thinking",
}
# Where the release writes its turns otherwise than the family's data/templates release (what
# the test cuts out of the rendering as the model's output; the dialect is untouched).
RENDERING = {
    # 1.6's prompt ends with "Here are my reasoning steps:\n", which its history never writes;
    # the last turn has no end token; arguments are written with `tojson` (an object, where
    # 1.5 wants JSON text)
    "Apriel-1.6-15b-Thinker-fixed.jinja": {"turn_start": "\n<|begin_assistant|>\n", "end": "",
                                           "string_arguments": False},
}
# Templates that do not read back, and why (the gaps issue 36 allows; each has a test below).
GAPS = {
    "Kimi-K2-Thinking.jinja": "llama.cpp's adaptation calls list.append, which the sandbox that "
                              "renders templates (as transformers does) refuses: it cannot "
                              "render a turn",
}
# Argument values drawn where the template cannot write every JSON value (test_derive's
# TEMPLATE_VALUES): Hermes 3's template is Hermes 2 Pro's, which recurses on a "null" type.
VALUES = {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja":
          TEMPLATE_VALUES["NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"]}


def _provenance() -> list[dict[str, str]]:
    with (UNSEEN_DIR / "PROVENANCE.tsv").open(encoding="utf-8", newline="") as file:
        return list(csv.DictReader(file, delimiter="\t"))


def _template(name: str) -> str:
    return (UNSEEN_DIR / name).read_text(encoding="utf-8")


def _derives(name: str) -> bool:
    try:
        derive_format(_template(name))
    except DerivationError:
        return False
    return True


DERIVING = [name for name in sorted(DETECTED) if name not in FAMILY_OF]


def test_the_templates_are_unseen_and_their_provenance_holds() -> None:
    """Every file is in PROVENANCE.tsv with its size and sha256, and no template of
    data/templates has the same bytes."""
    rows = _provenance()
    assert sorted(row["local_file"] for row in rows) == sorted(DETECTED) \
        == sorted(path.name for path in UNSEEN_DIR.glob("*.jinja"))
    known = {hashlib.sha256(path.read_bytes()).hexdigest()
             for path in TEMPLATES_DIR.glob("*.jinja")}
    for row in rows:
        data = (UNSEEN_DIR / row["local_file"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (int(row["bytes"]), row["sha256"])
        assert row["sha256"] not in known, row["local_file"]
        assert len(row["commit"]) == 40 and row["repo"] and row["path"]


def test_each_is_detected_as_the_family_it_is_a_release_of() -> None:
    """Never "unknown": each template is claimed by the family PROVENANCE.tsv names."""
    assert {name: detect_dialect(_template(name)) for name in DETECTED} == DETECTED
    assert {row["local_file"]: row["family"] for row in _provenance()} == DETECTED


def test_the_family_read_backs_are_the_templates_that_do_not_derive() -> None:
    assert {name for name in DETECTED if not _derives(name)} == set(FAMILY_OF)
    assert all(FAMILIES[FAMILY_OF[name]].dialect == DETECTED[name] for name in FAMILY_OF)
    assert len({DETECTED[name] for name in DETECTED}) >= 5  # five families or more


@pytest.mark.parametrize("name", DERIVING)
@ROUND_TRIPS
@given(data=st.data())
def test_turns_read_back_through_the_derived_dialect(name: str, data: st.DataObject) -> None:
    """Random calls (names, nested arguments with unicode and quotes, one to three calls) as the
    template renders them read back through the dialect derived from it."""
    assert_derived_round_trip(_template(name), {}, VALUES.get(name), data)


@pytest.mark.parametrize("name", sorted(set(FAMILY_OF) - set(GAPS)))
@ROUND_TRIPS
@given(data=st.data())
def test_turns_read_back_through_the_family_module(name: str, data: st.DataObject) -> None:
    """The same through the family module detection picks, configured from this template."""
    family = dataclasses.replace(FAMILIES[FAMILY_OF[name]], template=name,
                                 templates_dir=UNSEEN_DIR, **RENDERING.get(name, {}))
    assert_template_turn_reads_back(family, data)


CALL = {"id": "functions.a:0", "type": "function", "function": {"name": "a", "arguments": {}}}
TURN = {"role": "assistant", "content": "", "tool_calls": [CALL]}


def test_kimi_k2_thinkings_adaptation_cannot_render_a_call() -> None:
    """So that the gap shows when it closes (a sandbox that allows it, a fixed template)."""
    with pytest.raises(Exception, match="unsafe"):
        render_chat_template(_template("Kimi-K2-Thinking.jinja"), [*PROMPT, TURN])
