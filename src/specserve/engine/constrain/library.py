"""xgrammar, imported on first use.

Importing xgrammar costs ~2.5 s here, paid by every server start and CLI run, and most never
constrain anything; so no module of this package imports it at load time: they call `xgrammar()`.
"""

from __future__ import annotations

import functools


@functools.cache
def xgrammar():
    """The xgrammar module, imported the first time a grammar is built."""
    import xgrammar as module

    return module
