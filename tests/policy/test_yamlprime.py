"""`proctor.policy._yamlprime`: yaml's non-printable check, compiled from an equivalent pattern, matches the same."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml

from proctor.policy import _yamlprime

EVERY_CHARACTER = "".join(map(chr, range(0x110000)))


def test_the_equivalent_pattern_matches_exactly_the_same_characters() -> None:
    """On every code point (surrogates included) both patterns match at the same places."""
    def positions(pattern: str) -> list[int]:
        return [m.start() for m in re.finditer(pattern, EVERY_CHARACTER)]

    matched = positions(_yamlprime.NON_PRINTABLE)
    assert matched == positions(_yamlprime.EQUIVALENT)
    # C0 controls but tab, LF, CR (29); DEL to U+009F but NEL (32); surrogates (2048); U+FFFE, U+FFFF (2)
    assert len(matched) == 29 + 32 + 2048 + 2


def test_the_pattern_replaced_is_yamls_own() -> None:
    """The pattern primed is the one this PyYAML compiles (else priming would change nothing)."""
    code = "import yaml; print(repr(yaml.reader.Reader.NON_PRINTABLE.pattern))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == repr(_yamlprime.NON_PRINTABLE)


def test_yaml_primed_reports_a_control_character_as_it_always_did() -> None:
    """After prime(), yaml uses the equivalent pattern and refuses a control character with the same message."""
    text = "version: 1\nrules: [\x07]\n"
    try:
        yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        expected = str(exc)
    code = ("import sys; from proctor.policy import _yamlprime; _yamlprime.prime(); import yaml\n"
            "assert yaml.reader.Reader.NON_PRINTABLE.pattern == _yamlprime.EQUIVALENT\n"
            "try: yaml.compose(sys.argv[1], Loader=yaml.SafeLoader)\n"
            "except yaml.YAMLError as exc: print(exc)")
    out = subprocess.run([sys.executable, "-c", code, text], capture_output=True, text=True, check=True).stdout
    assert out.strip() == expected.strip()
    assert "special characters are not allowed" in expected
