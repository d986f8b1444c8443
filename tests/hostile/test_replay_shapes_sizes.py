"""The replay shapes decode and replay at every size the shapes benchmark asks for.

A shape that takes a new stream or private pool per cycle reaches the decoder's limit of
(pool, stream) pairs (``MAX_LANES``) at about 330,000 entries; ``benchmarks/bench_replay_shapes.py``
asks for 500,000 and 1,000,000. The shapes take their first lane again after
``replay_shapes.LANES``, so they stay valid traces the decoder accepts at any size.
"""

from __future__ import annotations

import pytest

from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import simulate
from allocconf_widget.core.sim.trace.decode import MAX_LANES
from allocconf_widget.core.sim.trace.extract import extract_trace
from tests.hostile.replay_shapes import SHAPES

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("shape", ["many_streams", "many_pools"])
def test_a_shape_past_the_lane_limit_decodes_and_replays(shape: str) -> None:
    build, conf = SHAPES[shape]
    entries = build(5 * (MAX_LANES + 1_000))
    trace = extract_trace({"device_traces": [entries], "segments": []})
    assert len(trace.lane_streams) <= MAX_LANES
    result = simulate(trace, SimSettings.from_string(conf, (2, 11)))
    assert result.num_device_alloc == len(entries) // 5
