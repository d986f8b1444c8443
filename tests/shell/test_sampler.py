"""The sampler behind the Monitor widget: starting and stopping monitors from several threads at
once (as panel callbacks do) leaves no sampler thread. The sampler alone:
tests/unit/test_sampler.py.
"""

from __future__ import annotations

import threading

from tests.unit.test_sampler import _allocconf_threads, _wait


def test_concurrent_start_and_stop_leave_no_sampler_thread():
    """Panel callbacks run on subshell threads: 4 threads x 25 start/stop pairs."""
    from allocconf_widget.views.widgets import monitor

    before = set(_allocconf_threads())

    def churn():
        for _ in range(25):
            monitor.start_monitor(interval=0.01, demo=False, renderer="svg")
            monitor.stop_monitor()

    workers = [threading.Thread(target=churn) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    monitor.stop_monitor()
    assert _wait(lambda: not (set(_allocconf_threads()) - before))
