"""Who held the memory: live bytes grouped by Python frame, or by size class, stream and pool."""

from __future__ import annotations

from allocconf_widget.core.memory.sites import BY_CLASS, BY_FRAME, NO_FRAMES, frame_site, top_sites
from tests.snapshot_builders import MIB, block, segment, snapshot


def _framed(size: int, filename: str, line: int, name: str) -> dict:
    b = block(size)
    b["frames"] = [{"filename": "/site-packages/torch/nn/modules/linear.py", "line": 125,
                    "name": "forward"},
                   {"filename": filename, "line": line, "name": name}]
    return b


def test_without_stacks_sites_are_size_classes_streams_and_pools():
    snap = snapshot(
        segment(block(300 * MIB), block(300 * MIB), block(100 * MIB, "inactive")),
        segment(block(4 * MIB), block(2 * MIB, "inactive"), stream=7),
        segment(block(512), kind="small"),
    )
    report = top_sites(snap)
    assert report.by == BY_CLASS
    assert report.live_bytes == 604 * MIB + 512  # inactive blocks are not live
    top = report.sites[0]
    assert top.label == "100 MiB–1 GiB · stream 0x0 · default/large"
    assert (top.live_bytes, top.blocks, top.largest) == (600 * MIB, 2, 300 * MIB)
    assert report.sites[1].label == "1–10 MiB · stream 0x7 · default/large"
    assert "600.00 MiB" in report.lines()[1]


def test_with_stacks_sites_are_the_first_frame_outside_torch():
    snap = snapshot(segment(_framed(64 * MIB, "/home/me/train.py", 42, "step"),
                            _framed(32 * MIB, "/home/me/train.py", 42, "step"),
                            _framed(8 * MIB, "/tmp/ipykernel_1/123.py", 3, "<module>"),
                            block(16 * MIB)))
    report = top_sites(snap)
    assert report.by == BY_FRAME
    assert [(s.label, s.live_bytes) for s in report.sites] == [
        ("me/train.py:42 step", 96 * MIB), (NO_FRAMES, 16 * MIB),
        ("ipykernel_1/123.py:3 <module>", 8 * MIB)]


def test_only_the_top_sites_are_listed_and_the_rest_summed():
    snap = snapshot(segment(*[_framed((i + 1) * MIB, f"/x/f{i}.py", i, "g") for i in range(12)]))
    report = top_sites(snap, limit=3)
    assert len(report.sites) == 3 and report.rest_sites == 9
    assert report.rest_bytes == sum(range(1, 10)) * MIB
    assert report.lines()[-1].strip().endswith("in 9 more sites")


def test_frames_inside_torch_only_fall_back_to_the_innermost():
    frames = [{"filename": "/torch/a.py", "line": 1, "name": "f"},
              {"filename": "??", "line": 0, "name": "?"}]
    assert frame_site(frames) == "torch/a.py:1 f"
    assert frame_site([]) is None


def test_an_empty_snapshot_says_so():
    report = top_sites(snapshot())
    assert report.sites == () and "no live blocks" in report.lines()[-1]
