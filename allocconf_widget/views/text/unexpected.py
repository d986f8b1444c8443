"""What a front end says about an error nobody foresaw, instead of a traceback.

Every file we read is untrusted: a snapshot can be shaped in ways no check names, and the
answer to those is one message, the same from the CLI and the magic (a traceback from
``%allocconf simulate FILE`` while the CLI said one line was two front ends disagreeing).
``ALLOCCONF_DEBUG=1`` lets the exception through for whoever reports it.
"""

from __future__ import annotations

import os

from allocconf_widget._errors import printable

DEBUG_VARIABLE = "ALLOCCONF_DEBUG"


def debugging() -> bool:
    """True when the user asked for tracebacks (``ALLOCCONF_DEBUG=1``)."""
    return bool(os.environ.get(DEBUG_VARIABLE))


def unexpected_error(exc: BaseException) -> str:
    """One line naming the error, bounded in length, and how to see or report it."""
    return (f"the input could not be processed ({type(exc).__name__}: {printable(str(exc), 300)}). "
            "If the file is one torch wrote unchanged, please report this; "
            f"{DEBUG_VARIABLE}=1 shows the traceback.")
