"""JSON schema `format: email` writes only addresses pydantic's EmailStr takes.

EmailStr is email-validator 2.x's `validate_email(..., check_deliverability=False)` with its defaults
(pydantic's `networks.validate_email`). xgrammar 0.2.9's own email rule let through what it refuses:
a domain without a period (`a@b`), a quoted local part (`"a b"@x.co`), a top-level domain that ends
in a digit (`a@x.c1`), special-use domains (`a@x.test`, `a@x.localhost`), two dashes after two
characters (`a@ab--c.com`), a label over 63 characters, an address over 254. A client's
`parse(..., response_format=Model)` with an EmailStr field failed on such an answer we called valid.

`_email_str` is email-validator's syntax rules for ASCII addresses, written out here (the package
is not a dependency); the samples were also checked against email-validator 2.3.0 itself, once, by
hand (see the commit that added this file).
"""

from __future__ import annotations

import json
import random
import re
import string

import xgrammar as xgr

from specserve.engine.constrain import ConstraintFactory, GrammarSpec

VOCAB = list(string.printable) + ["<eos>"]  # one token per character
ATEXT = "a-zA-Z0-9_!#$%&'*+\\-/=?^`{|}~"
DOT_ATOM = re.compile(f"[{ATEXT}]+(?:\\.[{ATEXT}]+)*")
LABEL = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?")
SPECIAL = ("arpa", "invalid", "local", "localhost", "onion", "test")  # email-validator's SPECIAL_USE_DOMAIN_NAMES


def _email_str(text: str) -> bool:
    """Whether email-validator (as EmailStr calls it) takes an ASCII address without a display name."""
    local, at, domain = text.rpartition("@")
    if not at or len(text) > 254 or not DOT_ATOM.fullmatch(local):  # a quoted local part is not allowed
        return False
    labels = domain.split(".")
    if len(domain) > 253 or len(labels) < 2 or not re.search(r"[A-Za-z]\Z", domain):
        return False
    if not all(LABEL.fullmatch(label) and len(label) <= 63 for label in labels):
        return False
    if any(label[2:4] == "--" for label in labels):  # RFC 5890's R-LDH labels (Punycode's xn-- is not drawn)
        return False
    return labels[-1].lower() not in SPECIAL


def _servable(text: str) -> bool:
    """What the pattern is written to take (a regex cannot count across parts, so the parts are
    bounded): a local part of one atom of at most 64 characters or two or three of at most 20; one to
    four labels of at most 29 characters (no xn-- label); a top-level domain of letters."""
    local, _, domain = text.rpartition("@")
    atoms, labels = local.split("."), domain.split(".")
    short_local = len(atoms) == 1 and len(local) <= 64 or len(atoms) <= 3 and max(map(len, atoms)) <= 20
    short_labels = len(labels) <= 5 and max(map(len, labels[:-1])) <= 29 and len(labels[-1]) <= 63
    return short_local and short_labels and labels[-1].isalpha()


def _samples(rng: random.Random) -> list[str]:
    fixed = [
        "a@b",
        '"a b"@x.co',
        "a@x.c1",
        "a@x.localhost",
        "a@x.test",
        "a@x.TEST",
        "a@x.tests",
        "a@x.loca",
        "a@x.localhos",
        "a@ab--c.com",
        "a@abc--d.com",
        "a@xn--zz.com",
        "a@" + "x" * 64 + ".com",
        "john.doe+tag@mail.example.co.uk",
        "o'brien{x}|y~z@host.io",
        "a@b.c",
        "a@-x.com",
        "a..b@x.com",
        ".a@x.com",
        "x" * 64 + "@ab.io",
        "x" * 65 + "@ab.io",
    ]
    tlds = ["c1", "test", "Test", "local", "localhost", "arpa", "onion", "invalid", "7", "tests", "Org", "x"] + [
        "com"
    ] * 8

    def label() -> str:
        n = rng.choice([1, 2, 3, 5, 12, 29, 30, 63, 64])
        inner = "".join(rng.choice("ab9" * 6 + "-") for _ in range(n))
        return (rng.choice("ab9ab9-") + inner[1:-1] + rng.choice("ab9ab9-"))[:n]

    def local() -> str:
        if rng.random() < 0.2:
            return rng.choice(["x" * 64, "x" * 65, "a..b", ".a", "a.", '"a b"', "a b"])
        return ".".join(
            "".join(rng.choice("ab9_+'") for _ in range(rng.choice([1, 3, 8, 20, 21])))
            for _ in range(rng.randint(1, 4))
        )

    drawn = [
        f"{local()}@{''.join(label() + '.' for _ in range(rng.choice([0, 1, 1, 1, 2, 2, 3, 4, 5])))}{rng.choice(tlds)}"
        for _ in range(500)
    ]
    return fixed + drawn


def test_the_email_format_writes_only_what_email_str_takes():
    factory = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    matcher = xgr.GrammarMatcher(factory.compile(GrammarSpec("json_schema", {"type": "string", "format": "email"})))
    taken = 0
    for text in _samples(random.Random(5)):
        matcher.reset()
        got = matcher.accept_string(json.dumps(text)) and matcher.is_completed()
        assert got == (_email_str(text) and _servable(text)), text
        taken += got
    assert taken > 30  # enough of the draw is valid to mean something
