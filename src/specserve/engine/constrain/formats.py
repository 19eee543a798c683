"""String formats (JSON Schema's `format`) written as the patterns we enforce them with.

xgrammar 0.2.9 enforces some formats more loosely than pydantic and Python's parsers (a date
2023-02-30, an IPv4 octet 01, a 64-character hostname label), and no length bound next to a
format: `rewrite.for_xgrammar` writes those formats as the stricter patterns here instead.
"""

from __future__ import annotations

import string

from .errors import ConstraintError

# xgrammar 0.2.9's own regexes for these formats let invalid values through (measured): any day
# 01-31 in any month ("2023-02-30", "2023-04-31"), year 0000 and an IPv4 octet with a leading zero
# ("01.2.3.4"), all of which pydantic, Python's `date.fromisoformat` and `ipaddress` refuse, so a
# client's `parse(..., response_format=Model)` failed on an answer we called valid. They are
# enforced as these patterns instead: calendar dates (leap years included), years 0001-9999,
# octets without leading zeros. Times are xgrammar's, less the leap second (":60"), which RFC 3339
# allows and pydantic's `time` and `datetime` refuse: a stricter grammar never writes a value the
# schema rejects, and a client's pydantic model then parses every answer.
_YEAR = r"(?:000[1-9]|00[1-9]\d|0[1-9]\d{2}|[1-9]\d{3})"
_LEAP_YEAR = r"(?:\d{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
    rf"|02-(?:0[1-9]|1\d|2[0-8]))|{_LEAP_YEAR}-02-29)"
)
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"


def _label(most: int) -> str:
    """A hostname label (RFC 1123) of 1..most letters, digits and inner hyphens."""
    return rf"[a-zA-Z0-9](?:[a-zA-Z0-9\-]{{0,{most - 2}}}[a-zA-Z0-9])?"


# A hostname: labels of at most 63 characters, at most 253 in all (RFC 1123; xgrammar's own let a
# 64-character label through). A regex cannot count across labels, so it is written as up to four
# labels (the last at most 61 long: 3 x 63 + 61 + 3 dots = 253) or five to eight of at most 30.
_HOSTNAME = rf"(?:{_label(63)}(?:\.{_label(63)}){{0,2}}(?:\.{_label(61)})?|{_label(30)}(?:\.{_label(30)}){{4,7}})"


def _not_words(words: tuple[str, ...], most: int) -> str:
    """A pattern of 1..most letters, either case, that spell none of `words` (lowercase): a regex
    without lookahead, walked down the words' trie (a letter off it frees the rest)."""
    trie: dict = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}  # the end of a word

    def walk(node: dict, depth: int) -> str:
        off = "".join(c + c.upper() for c in string.ascii_lowercase if c not in node)
        tail = f"[a-zA-Z]{{0,{most - depth - 1}}}" if most - depth > 1 else ""
        ways = [f"[{off}]{tail}"] if off and depth < most else []
        ways += [f"[{c}{c.upper()}]{walk(child, depth + 1)}" for c, child in node.items() if c and depth < most]
        body = "(?:" + "|".join(ways) + ")"
        return body + "?" if depth and "" not in node else body

    return walk(trie, 0)


# An email address as pydantic's EmailStr takes it: email-validator 2.x with its defaults
# (check_deliverability off). xgrammar's own rule let through what it refuses: a quoted local
# part, a domain without a period, a top-level domain ending in a digit or one of its special-use
# names, two dashes after a label's first two characters, a label over 63 characters, an address
# over 254. Written stricter, as the other formats: ASCII; a local part of one atom of at most 64
# characters or two or three of at most 20; one to four labels of at most 29 characters, none with
# dashes as its 3rd and 4th (Punycode's xn-- labels are left out: they must also decode); a
# top-level domain of letters (at most 63) that is not arpa, invalid, local, localhost, onion or
# test. At most 246 characters in all.
_ATEXT = r"[a-zA-Z0-9_!#$%&'*+\-/=?^`{|}~]"
_LDH_REST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9\-]{0,25}[a-zA-Z0-9])?|-[a-zA-Z0-9](?:[a-zA-Z0-9\-]{0,24}[a-zA-Z0-9])?)"
_EMAIL_LABEL = rf"[a-zA-Z0-9](?:[a-zA-Z0-9]|[a-zA-Z0-9\-]{_LDH_REST})?"  # 1..29, no "--" at its 3rd-4th
EMAIL_SPECIAL_TLDS = ("arpa", "invalid", "local", "localhost", "onion", "test")  # email-validator's
_EMAIL = (
    rf"(?:{_ATEXT}{{1,64}}|{_ATEXT}{{1,20}}(?:\.{_ATEXT}{{1,20}}){{1,2}})"
    rf"@(?:{_EMAIL_LABEL}\.){{1,4}}{_not_words(EMAIL_SPECIAL_TLDS, 63)}"
)
FORMAT_PATTERNS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}T{_TIME}",
    "ipv4": rf"{_OCTET}(?:\.{_OCTET}){{3}}",
    "hostname": _HOSTNAME,
    "email": _EMAIL,
}


# A `format: uri` with a length bound (pydantic's HttpUrl and AnyUrl write one) is written as this
# pattern: xgrammar enforces no length next to a format or a pattern. It is a strict subset of RFC
# 3986: scheme://host[:port][/path][?query][#fragment], no percent-escapes, each part bounded so
# that every value it allows has the schema's length. A stricter grammar never writes a value the
# schema rejects; it only cannot write some (a mailto: link, a %20).
_URI_SCHEME = r"[a-zA-Z][a-zA-Z0-9+.\-]{0,15}"  # at most 16 characters
_URI_HOST = r"[a-zA-Z0-9\-._~!$&'()*+,;=]"  # a reg-name's characters, no escapes
_URI_PCHAR = r"a-zA-Z0-9\-._~!$&'()*+,;=:@"  # a path segment's characters, no escapes
_URI_FIXED = 16 + len("://") + len(":65535") + len("/?#")  # the longest scheme, the port and separators
_PORT = r"(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"  # 0-65535
_URI_SHORTEST = len("a://h")
URI_MIN_MAX_LENGTH = _URI_FIXED + 4  # room for a host and a little path, query and fragment


def bounded_uri(schema: dict) -> bool:
    """Whether `schema` is a `format: uri` with a length bound (written as `uri_pattern`, not a format)."""
    return schema.get("format") == "uri" and ("minLength" in schema or "maxLength" in schema)


def uri_pattern(min_length, max_length, path: str = "schema") -> str:
    """The pattern of a `format: uri` string of min_length..max_length characters (no bound: None)."""
    for name, value in (("minLength", min_length), ("maxLength", max_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConstraintError(f"{path}: {name} must be a non-negative integer")
    if max_length is not None and max_length < URI_MIN_MAX_LENGTH:
        raise ConstraintError(f"{path}: a 'uri' format with a maxLength below {URI_MIN_MAX_LENGTH} is not supported")
    budget = 4096 if max_length is None else max_length - _URI_FIXED  # characters for host, path, query, fragment
    needs_path = min_length > _URI_SHORTEST  # the shortest value, a://h, is too short without one
    least = max(0, min_length - _URI_SHORTEST - 1)  # path characters after its "/" that make it long enough
    if least > budget - 1:
        raise ConstraintError(f"{path}: minLength {min_length} leaves no room under maxLength {max_length}")
    host = min(253, max(1, budget // 2), budget - least)  # a DNS name is at most 253 characters
    rest = budget - host
    tail = max(least, rest - rest // 3 - rest // 6)  # the path's share; the query and fragment get the rest
    query = (rest - tail) * 2 // 3
    fragment = rest - tail - query
    path_part = rf"/[{_URI_PCHAR}/]{{{least},{tail}}}"
    return (
        rf"{_URI_SCHEME}://{_URI_HOST}{{1,{host}}}(?::{_PORT})?"
        + (path_part if needs_path else rf"(?:{path_part})?")
        + rf"(?:\?[{_URI_PCHAR}/?]{{0,{query}}})?(?:#[{_URI_PCHAR}/?]{{0,{fragment}}})?"
    )
