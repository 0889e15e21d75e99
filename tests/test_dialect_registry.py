"""The registry finds the families by themselves: declared name and priority, detection order,
a broken family module left out (logged) while the others keep working."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pegmask.bench.data import TEMPLATES_DIR
from pegmask.dialects import (
    cohere_xml,
    gemma,
    minimax_m3,
    python_literals,
    quoted_values,
    registry,
)
from pegmask.dialects.base import Dialect, TurnDialect
from pegmask.dialects.values import value_readers

# The detection order the registry had as a hand-written list.
DETECTION_ORDER = [
    "llmjp-harmony", "harmony", "dsml", "kimi", "kimi-k3", "gemma", "glm", "minimax",
    "minimax-m3", "cohere", "command-r", "cohere-xml", "nemotron", "seed-oss", "hunyuan",
    "deepseek-v3.1", "deepseek-r1", "mistral", "pythonic", "llama3", "apriel", "apertus", "functionary-v3.2",
    "functionary-v3.1", "phi4-mini", "granite", "mimo", "exaone", "hermes-xml", "hermes",
]


def test_the_families_are_found_in_their_declared_priority_order() -> None:
    assert registry.dialect_names() == DETECTION_ORDER
    classes = registry.dialect_classes()
    assert [cls.name for cls in classes] == DETECTION_ORDER
    priorities = [cls.priority for cls in classes]
    assert priorities == sorted(set(priorities))  # ascending, no two alike


def test_the_value_readers_come_from_the_families() -> None:
    """The families' readers, and the derived dialect's (a derived Gemma-style quoted-value
    format: the engine parses with the grammar alone, so its tag must be known)."""
    assert value_readers() == {"gemma": gemma.read_value, "m3": minimax_m3.read_value,
                               "cofl": cohere_xml.read_value,
                               "quoted": quoted_values.read_value,
                               "python": python_literals.read_value}


def test_a_family_declares_its_own_priority() -> None:
    with pytest.raises(TypeError, match="no priority"):
        class _Unordered(TurnDialect):
            name = "unordered"


def test_the_default_detection_needs_every_probe_marker_in_one_rendering() -> None:
    class Probed(Dialect):
        name, priority = "probed", 1
        probe = ("<call>", re.compile(r"name=\w+"))

    class Marked(Dialect):
        name, priority = "marked", 1
        template_marker = "<|marker|>"

    assert Probed.owns_template("", ["x <call> name=f"])
    assert not Probed.owns_template("<call> name=f", ["<call>", "name=f"])
    assert not Dialect.owns_template("anything", ["anything"])
    assert Marked.owns_template("a <|marker|> b", [])
    assert not Marked.owns_template("a b", ["<|marker|>"])


FAMILIES = '''
from pegmask.dialects.base import TurnDialect


class Later(TurnDialect):
    name = "later"
    priority = 20


class Sooner(TurnDialect):
    name = "sooner"
    priority = 10
'''


def test_a_module_that_fails_to_import_is_logged_and_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    package = tmp_path / "fake_families"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "good.py").write_text(FAMILIES)
    (package / "broken.py").write_text("import no_such_module_at_all\n")
    (package / "unordered.py").write_text(
        "from pegmask.dialects.base import TurnDialect\n\n\n"
        "class Unordered(TurnDialect):\n    name = 'unordered'\n")
    (package / "twice.py").write_text(FAMILIES.replace("Sooner", "Again"))
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.ERROR, logger=registry.__name__):
        found = registry.discover("fake_families")
    assert list(found) == ["sooner", "later"]
    assert found["sooner"].__module__ == "fake_families.good"
    logged = caplog.text
    assert "fake_families.broken failed to import" in logged
    assert "fake_families.unordered failed to import" in logged
    assert "'later' of fake_families.twice is already defined by fake_families.good" in logged


def _failing(name: str, real: Callable[[str], Any]) -> Callable[[str], Any]:
    def import_module(module_name: str) -> Any:
        if module_name == name:
            raise ImportError(f"{name} is broken")
        return real(module_name)
    return import_module


def test_a_broken_family_leaves_the_others_working(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(registry, "import_module",
                        _failing("pegmask.dialects.gemma", registry.import_module))
    with caplog.at_level(logging.ERROR, logger=registry.__name__):
        families = registry.discover("pegmask.dialects")
    assert "pegmask.dialects.gemma failed to import" in caplog.text
    assert list(families) == [name for name in DETECTION_ORDER if name != "gemma"]
    monkeypatch.setattr(registry, "_families", lambda: families)
    with pytest.raises(ValueError, match="unknown dialect 'gemma'"):
        registry.get_dialect("gemma")
    qwen3 = (TEMPLATES_DIR / "Qwen-Qwen3-0.6B.jinja").read_text()
    assert registry.detect_dialect(qwen3) == "hermes"
    assert registry.get_dialect("glm").parse('<tool_call>f<arg_key>a</arg_key>'
                                             '<arg_value>1</arg_value></tool_call>')["tool_calls"]
