"""The JSON Schema `format` values the grammar enforces, as full-match regular expressions.

Formats not listed here are annotations (JSON Schema's default) and accept any string; that
covers OpenAPI's `int32`, `double`, `byte`, `password`, ... and `regex` / `uri-template`, whose
languages are not regular. Deliberate simplifications, all towards accepting more:
dates accept February 29 in every year; hostnames and e-mail domains do not enforce the 63 / 253
character limits; `uri` checks the RFC 3986 character repertoire and the scheme, not the
detailed authority syntax.
"""

from __future__ import annotations

from functools import cache

from pegmask.grammars.ir import Node
from pegmask.grammars.regex import regex_to_node

_DATE = (r"\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])"
         r"|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2\d))")
_OFFSET = r"(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:(?:[0-5]\d|60)(?:\.\d+)?" + _OFFSET
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_IDN_LABEL = r"[A-Za-z0-9\u00a1-\uffff](?:[A-Za-z0-9\u00a1-\uffff-]*[A-Za-z0-9\u00a1-\uffff])?"
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"
_URI_CHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?\[\]]|%[0-9A-Fa-f]{2})"
_IRI_CHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?\[\]\u00a0-\ud7ff\ue000-\U0010ffff]|%[0-9A-Fa-f]{2})"
_POINTER = r"(?:/(?:[^~/]|~[01])*)*"


def _ipv6() -> str:
    """RFC 3986 IPv6address: the nine forms of `::` compression."""
    def h16s(n: int) -> str:
        return f"(?:{_H16}:){{{n}}}" if n else ""

    def upto(n: int) -> str:
        return f"(?:(?:{_H16}:){{0,{n}}}{_H16})?" if n >= 0 else ""

    forms = [f"{h16s(6)}{_LS32}", f"::{h16s(5)}{_LS32}", f"(?:{_H16})?::{h16s(4)}{_LS32}"]
    forms += [f"{upto(k)}::{h16s(3 - k)}{_LS32}" for k in (1, 2, 3)]
    forms += [f"{upto(4)}::{_LS32}", f"{upto(5)}::{_H16}", f"{upto(6)}::"]
    return "(?:" + "|".join(forms) + ")"


_DURATION_DATE = r"(?:\d+Y(?:\d+M)?(?:\d+D)?|\d+M(?:\d+D)?|\d+D)"
_DURATION_TIME = r"T(?:\d+H(?:\d+M)?(?:\d+S)?|\d+M(?:\d+S)?|\d+S)"

FORMATS: dict[str, str] = {
    "date-time": rf"{_DATE}[Tt]{_TIME}",
    "date": _DATE,
    "time": _TIME,
    "duration": rf"P(?:{_DURATION_DATE}(?:{_DURATION_TIME})?|{_DURATION_TIME}|\d+W)",
    "email": rf"{_ATOM}(?:\.{_ATOM})*@{_LABEL}(?:\.{_LABEL})*",
    "idn-email": rf"[^\s@\"(),:;<>\[\\\]]+@{_IDN_LABEL}(?:\.{_IDN_LABEL})*",
    "hostname": rf"{_LABEL}(?:\.{_LABEL})*",
    "idn-hostname": rf"{_IDN_LABEL}(?:\.{_IDN_LABEL})*",
    "ipv4": _IPV4,
    "ipv6": _ipv6(),
    "uuid": r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}",
    "uri": rf"[A-Za-z][A-Za-z0-9+.\-]*:{_URI_CHAR}*(?:#{_URI_CHAR}*)?",
    "uri-reference": rf"{_URI_CHAR}*(?:#{_URI_CHAR}*)?",
    "iri": rf"[A-Za-z][A-Za-z0-9+.\-]*:{_IRI_CHAR}*(?:#{_IRI_CHAR}*)?",
    "iri-reference": rf"{_IRI_CHAR}*(?:#{_IRI_CHAR}*)?",
    "json-pointer": _POINTER,
    "relative-json-pointer": rf"(?:0|[1-9]\d*)(?:#|{_POINTER})",
}


@cache
def format_node(name: str) -> Node:
    """Character-level IR for a known format (see `FORMATS`)."""
    return regex_to_node(FORMATS[name])
