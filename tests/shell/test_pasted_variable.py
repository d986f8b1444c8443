"""A pasted whole variable replaces the staged configuration, and says so (issue 24, item 11)."""

from __future__ import annotations

from tests.torch_versions import HAS_EXPANDABLE


def test_a_pasted_variable_replaces_what_was_staged(ip, capsys):
    ip.run_line_magic("allocconf", "set max_split_size_mb=256")
    capsys.readouterr()
    # an option of every release (torch 1.13 has no expandable_segments)
    pasted = "expandable_segments:True" if HAS_EXPANDABLE else "roundup_power2_divisions:4"
    staged = ip.run_line_magic("allocconf", f"-r set PYTORCH_CUDA_ALLOC_CONF={pasted}")
    out = capsys.readouterr().out
    assert staged.to_string() == pasted
    assert "replacing the staged max_split_size_mb:256" in out
    assert "max_split_size_mb together with expandable_segments" not in out  # no mix, no warning


def test_options_typed_one_by_one_still_add_up(ip, capsys):
    ip.run_line_magic("allocconf", "set max_split_size_mb=256")
    staged = ip.run_line_magic("allocconf", "-r set roundup_power2_divisions=4")
    assert staged.to_string() == "max_split_size_mb:256,roundup_power2_divisions:4"
