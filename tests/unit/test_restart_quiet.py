"""While ``%allocconf restart`` waits for the Jupyter server, an interrupt (jupyter_client sends
one before it restarts a kernel) is swallowed, for a grace period only. The restart through a
real server: tests/kernel/test_restart_quiet.py.
"""

from __future__ import annotations

import pytest


def test_interrupts_come_back_after_the_grace() -> None:
    """The swallowing handler is temporary: after its grace the previous handler runs."""
    import signal

    from allocconf_widget.adapters.frontend import quiet_interrupts_while_restarting

    previous = signal.getsignal(signal.SIGINT)
    # Python's own handler as the one to come back, whatever this process inherited: started in
    # the background by a shell (`.ci/run &`), SIGINT arrives ignored and nothing would raise
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert quiet_interrupts_while_restarting(grace=0.0)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert quiet_interrupts_while_restarting(grace=60.0)
        signal.raise_signal(signal.SIGINT)  # swallowed: the kernel is being restarted
    finally:
        signal.signal(signal.SIGINT, previous)
